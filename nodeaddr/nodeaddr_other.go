//go:build !linux

package nodeaddr

import (
	"context"
	"net/netip"
)

// List returns ErrNotSupported.
func List(Options) ([]netip.Addr, error) { return nil, ErrNotSupported }

// Run returns ErrNotSupported.
func (w *Watcher) Run(context.Context, func([]netip.Addr)) error { return ErrNotSupported }
