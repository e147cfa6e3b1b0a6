package iptables

import "github.com/kproxy-dev/kproxy/servicelb"

// ErrNotSupported: nf_tables is Linux's. On other systems the package
// builds, so that an agent's other parts build anywhere, and New, Render
// and every method return ErrNotSupported.
var ErrNotSupported = servicelb.ErrNotSupported

// ErrInvalidOptions reports Options that New refuses.
var ErrInvalidOptions = servicelb.ErrInvalidOptions

// ErrClosed: a Sync or Cleanup after Close.
var ErrClosed = servicelb.ErrClosed

// ErrRenderOnly: a Sync or Cleanup of a Proxier made by ForRendering,
// which holds no socket.
var ErrRenderOnly = servicelb.ErrRenderOnly
