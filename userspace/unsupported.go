//go:build !linux

package userspace

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier serves service ports from user space. On this system it does
// nothing: New returns ErrNotSupported.
type Proxier struct{}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// Render returns ErrNotSupported.
func Render(*servicelb.State, Options) (string, error) { return "", errNotSupported }

// Probe returns ErrNotSupported.
func Probe(Options) error { return errNotSupported }

// ForRendering returns ErrNotSupported.
func ForRendering(Options) (*Proxier, error) { return nil, errNotSupported }

// New returns ErrNotSupported: the proxy needs Linux (splice(2), the
// namespace's sockets and addresses).
func New(Options) (*Proxier, error) { return nil, errNotSupported }

// Capabilities names the backend and declares nothing.
func (*Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "userspace"}
}

// Sync returns ErrNotSupported.
func (*Proxier) Sync(context.Context, *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{}, errNotSupported
}

// Cleanup returns ErrNotSupported.
func (*Proxier) Cleanup(context.Context) error { return errNotSupported }

// Close does nothing.
func (*Proxier) Close() error { return nil }

// Render returns ErrNotSupported.
func (*Proxier) Render(*servicelb.State) (string, error) { return "", errNotSupported }

// Stats returns nothing.
func (*Proxier) Stats() []PortStats { return nil }

// CheckFlow returns ErrNotSupported.
func (*Proxier) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{}, errNotSupported
}

// errNotSupported is ErrNotSupported, naming the backend.
var errNotSupported = fmt.Errorf("userspace: %w", ErrNotSupported)
