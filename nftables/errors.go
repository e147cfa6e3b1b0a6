package nftables

import "github.com/kproxy-dev/kproxy/servicelb"

// Errors a Proxier returns before it sends anything to the kernel. Each is
// wrapped with the option concerned; test for them with errors.Is. A
// service port the table cannot hold is refused with a
// *servicelb.ValidationError wrapping servicelb.ErrUnsupported or
// servicelb.ErrCapacity (see Proxier.Capabilities).
//
// They are servicelb's, shared by every backend.
var (
	// ErrInvalidOptions: an Options field is not valid.
	ErrInvalidOptions = servicelb.ErrInvalidOptions
	// ErrClosed: the Proxier was closed.
	ErrClosed = servicelb.ErrClosed
	// ErrNotSupported: nf_tables is Linux's. On other systems the package
	// builds, so that an agent's other parts build anywhere, and New,
	// Render and every method return ErrNotSupported.
	ErrNotSupported = servicelb.ErrNotSupported
	// ErrRenderOnly: a Sync or Cleanup of a Proxier made by ForRendering,
	// which holds no socket.
	ErrRenderOnly = servicelb.ErrRenderOnly
)
