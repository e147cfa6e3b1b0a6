//go:build !linux

package ipvs

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs IPVS; on this system it cannot.
type Proxier struct{}

// New returns ErrNotSupported.
func New(Options) (*Proxier, error) { return nil, errNotSupported }

// Render returns ErrNotSupported.
func Render(*servicelb.State, Options) (string, error) { return "", errNotSupported }

// Close does nothing.
func (p *Proxier) Close() error { return nil }

// Capabilities names the backend only.
func (p *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "ipvs"}
}

// Probe returns ErrNotSupported.
func Probe(Options) error { return errNotSupported }

// ForRendering returns ErrNotSupported.
func ForRendering(Options) (*Proxier, error) { return nil, errNotSupported }

// Render returns ErrNotSupported.
func (p *Proxier) Render(*servicelb.State) (string, error) { return "", errNotSupported }

// Sync returns ErrNotSupported.
func (p *Proxier) Sync(context.Context, *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{}, errNotSupported
}

// Cleanup returns ErrNotSupported.
func (p *Proxier) Cleanup(context.Context) error { return errNotSupported }

// Drain returns ErrNotSupported.
func (p *Proxier) Drain(context.Context) (int, error) { return 0, errNotSupported }

// CheckFlow returns ErrNotSupported.
func (p *Proxier) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{}, errNotSupported
}

// errNotSupported is ErrNotSupported, naming the backend.
var errNotSupported = fmt.Errorf("ipvs: %w", ErrNotSupported)
