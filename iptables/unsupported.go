//go:build !linux

package iptables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs iptables rules through nf_tables; on this system it
// cannot.
type Proxier struct{}

// Render returns ErrNotSupported.
func Render(*servicelb.State, Options) (string, error) { return "", errNotSupported }

// New returns ErrNotSupported.
func New(Options) (*Proxier, error) { return nil, errNotSupported }

// Probe returns ErrNotSupported.
func Probe(Options) error { return errNotSupported }

// ForRendering returns ErrNotSupported.
func ForRendering(Options) (*Proxier, error) { return nil, errNotSupported }

// Close does nothing.
func (px *Proxier) Close() error { return nil }

// Capabilities returns none.
func (px *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "iptables"}
}

// Sync returns ErrNotSupported.
func (px *Proxier) Sync(context.Context, *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{}, errNotSupported
}

// Cleanup returns ErrNotSupported.
func (px *Proxier) Cleanup(context.Context) error { return errNotSupported }

// Render returns ErrNotSupported.
func (px *Proxier) Render(*servicelb.State) (string, error) { return "", errNotSupported }

// RenderFamily returns ErrNotSupported.
func (px *Proxier) RenderFamily(*servicelb.State, servicelb.Family) (string, error) {
	return "", errNotSupported
}

// CheckFlow returns ErrNotSupported.
func (px *Proxier) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{}, errNotSupported
}

// Trace returns ErrNotSupported.
func (px *Proxier) Trace(context.Context, servicelb.Flow) (servicelb.Trace, error) {
	return servicelb.Trace{}, errNotSupported
}

// errNotSupported is ErrNotSupported, naming the backend.
var errNotSupported = fmt.Errorf("iptables: %w", ErrNotSupported)
