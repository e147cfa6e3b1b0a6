//go:build !linux

package ebpf

import (
	"context"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier balances sockets at the socket layer; on this system it cannot.
type Proxier struct{}

var errSystem = fmt.Errorf("ebpf: %w", &FeatureError{Feature: "Linux", Hint: "socket-level load balancing needs Linux's cgroup BPF hooks"})

// New returns an error wrapping a *FeatureError, which wraps
// ErrNotSupported: the hooks are Linux's.
func New(Options) (*Proxier, error) { return nil, errSystem }

// ForRendering returns a *FeatureError wrapping ErrNotSupported.
func ForRendering(Options) (*Proxier, error) { return nil, errSystem }

// Render returns an error wrapping ErrNotSupported.
func Render(*servicelb.State, Options) (string, error) { return "", errSystem }

// Probe returns a *FeatureError wrapping ErrNotSupported.
func Probe(Options) error { return errSystem }

// Close does nothing.
func (p *Proxier) Close() error { return nil }

// Capabilities returns none.
func (p *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "ebpf"}
}

// Sync returns ErrNotSupported.
func (p *Proxier) Sync(context.Context, *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{}, errSystem
}

// Cleanup returns ErrNotSupported.
func (p *Proxier) Cleanup(context.Context) error { return errSystem }

// Render returns ErrNotSupported.
func (p *Proxier) Render(*servicelb.State) (string, error) { return "", errSystem }

// Dump returns ErrNotSupported.
func (p *Proxier) Dump(context.Context) (string, error) { return "", errSystem }

// RemovePins returns ErrNotSupported.
func RemovePins(string) error { return errSystem }

// Attached returns ErrNotSupported.
func Attached(string) ([]ebpf.ProgramID, error) { return nil, errSystem }

// CheckFlow returns ErrNotSupported.
func (p *Proxier) CheckFlow(context.Context, *servicelb.Explanation) (servicelb.KernelCheck, error) {
	return servicelb.KernelCheck{}, errSystem
}
