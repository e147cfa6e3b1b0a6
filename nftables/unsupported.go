//go:build !linux

package nftables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs an nf_tables table; on this system it cannot.
type Proxier struct{}

// New returns ErrNotSupported.
func New(Options) (*Proxier, error) { return nil, errNotSupported }

// Probe returns ErrNotSupported.
func Probe(Options) error { return errNotSupported }

// ForRendering returns ErrNotSupported.
func ForRendering(Options) (*Proxier, error) { return nil, errNotSupported }

// Render returns ErrNotSupported.
func Render(*servicelb.State, Options) (string, error) { return "", errNotSupported }

// Close does nothing.
func (p *Proxier) Close() error { return nil }

// Capabilities returns none.
func (p *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "nftables"}
}

// Render returns ErrNotSupported.
func (p *Proxier) Render(*servicelb.State) (string, error) { return "", errNotSupported }

// Cleanup returns ErrNotSupported.
func (p *Proxier) Cleanup(context.Context) error { return errNotSupported }

// Sync returns ErrNotSupported.
func (p *Proxier) Sync(context.Context, *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{}, errNotSupported
}

// CheckFlow returns ErrNotSupported.
func (p *Proxier) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{}, errNotSupported
}

// Trace returns ErrNotSupported.
func (p *Proxier) Trace(context.Context, servicelb.Flow) (servicelb.Trace, error) {
	return servicelb.Trace{}, errNotSupported
}

// errNotSupported is ErrNotSupported, naming the backend.
var errNotSupported = fmt.Errorf("nftables: %w", ErrNotSupported)
