package servicelb

import (
	"context"
	"errors"
)

// The errors every backend shares: each package re-exports them
// (nftables.ErrClosed is servicelb.ErrClosed), so that errors.Is tells
// the same kind of failure of any backend with one value.
var (
	// ErrClosed: a Sync or Cleanup after the proxier was closed.
	ErrClosed = errors.New("proxier closed")
	// ErrNotSupported: the system cannot run the backend: not Linux (the
	// packages build everywhere, so that an agent's other parts do, and
	// every call returns it), or a kernel without a feature it needs.
	ErrNotSupported = errors.New("not supported on this system")
	// ErrInvalidOptions: an Options field of a backend is not valid.
	ErrInvalidOptions = errors.New("invalid options")
	// ErrRenderOnly: a Sync or Cleanup of a proxier made for rendering
	// only (ForRendering), which holds no kernel state.
	ErrRenderOnly = errors.New("a proxier for rendering only holds no kernel state")
	// ErrKernel: a kernel operation failed; the backend's error says
	// which.
	ErrKernel = errors.New("kernel operation failed")
	// ErrLinkConflict: a link the backend would use exists and is of a
	// kind it may not use.
	ErrLinkConflict = errors.New("link exists and is of another kind")
)

// ErrPermission: the kernel refused a proxier's request for lack of
// privilege. Programming a network namespace needs CAP_NET_ADMIN in it
// (and CAP_SYS_ADMIN to open sockets in another namespace than the
// caller's); the error that wraps it names the request refused.
var ErrPermission = errors.New("not permitted: programming a network namespace needs CAP_NET_ADMIN in it")

// Proxier makes a kernel dataplane match a desired State. The nftables,
// iptables, ipvs, ebpf and userspace packages implement it.
//
// Sync is idempotent: a Proxier remembers the last State it applied and
// sends the kernel only what Diff reports, so syncing an unchanged State
// sends nothing beyond a cheap check that nobody removed what it owns, and
// a sync's cost follows the size of the change, not of the State. A failed
// Sync leaves the previous state in place where the kernel allows it (see
// each backend) and the next Sync retries the whole difference. A Sync
// that writes the whole state instead (the first, a repair, a change of
// the node) says so with MarkFullSync, for the Runner's metrics.
type Proxier interface {
	// Sync makes the kernel match st.
	Sync(ctx context.Context, st *State) error
	// Cleanup removes everything the proxier owns from the kernel.
	Cleanup(ctx context.Context) error
	// Capabilities says what the proxier can express. A Runner refuses
	// services that do not fit, and Sync refuses service ports that do
	// not, before sending anything.
	Capabilities() Capabilities
	// Close releases what the proxier holds in the process (sockets,
	// descriptors, goroutines) and leaves the kernel state for the next
	// process; a Sync or Cleanup after it returns ErrClosed. A second
	// Close does nothing.
	Close() error
}

// Renderer is implemented by proxiers that can show the kernel state they
// would install for a State, in the text of the dataplane's own tools.
type Renderer interface {
	Render(st *State) (string, error)
}
