package ebpf

import (
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// ErrClosed: a Sync or Cleanup after Close.
var ErrClosed = servicelb.ErrClosed

// ErrRenderOnly: a Sync, Cleanup or Dump of a Proxier made by
// ForRendering.
var ErrRenderOnly = servicelb.ErrRenderOnly

// ErrNotSupported: the kernel or the system lacks something the Proxier
// needs. New returns an error wrapping a *FeatureError (errors.As) that
// wraps it, naming the feature, before it attaches anything.
var ErrNotSupported = servicelb.ErrNotSupported

// FeatureError names a missing kernel or system feature: it is
// servicelb.FeatureError, which every backend's Probe returns.
type FeatureError = servicelb.FeatureError

// ErrPinIncompatible: a map pinned in the place of the Proxier's own
// layout under Options.PinPath is not one it can read (someone else's).
// New returns a *PinError that wraps it. Maps of other layouts (another
// version, other Options.Sizes) are no obstacle: see New.
var ErrPinIncompatible = errors.New("pinned map this Proxier cannot read")

// PinError says that a map pinned under Options.PinPath cannot be
// adopted, and the way out: the Proxier never deletes a map it cannot
// read, so the pins go with RemovePins (kproxy --cleanup) while no
// Proxier uses them, which detaches the hooks they hold until the next
// process's first Sync attaches its own (with Options.Packets, the packet
// path serves the node's flows meanwhile).
type PinError struct {
	// Path is the pin, under PinPath.
	Path string
	// PinPath is the directory to give RemovePins.
	PinPath string
	// Err says what differs.
	Err error
}

func (e *PinError) Error() string {
	return fmt.Sprintf("ebpf: the map pinned at %s is not one this Proxier can read; "+
		"remove the pins under %s with ebpf.RemovePins (kproxy --cleanup) while no Proxier uses them, then start again: %v",
		e.Path, e.PinPath, e.Err)
}

// Unwrap returns ErrPinIncompatible and the underlying error.
func (e *PinError) Unwrap() []error { return []error{ErrPinIncompatible, e.Err} }

// ErrInvalidOptions: Options that cannot work.
var ErrInvalidOptions = servicelb.ErrInvalidOptions
