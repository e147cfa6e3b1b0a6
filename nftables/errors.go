package nftables

import "errors"

// Errors a Proxier returns before it sends anything to the kernel. Each is
// wrapped with the option concerned; test for them with errors.Is. A
// service port the table cannot hold is refused with a
// *servicelb.ValidationError wrapping servicelb.ErrUnsupported or
// servicelb.ErrCapacity (see Proxier.Capabilities).
var (
	// ErrInvalidOptions: an Options field is not valid.
	ErrInvalidOptions = errors.New("invalid nftables options")
	// ErrClosed: the Proxier was closed.
	ErrClosed = errors.New("nftables proxier closed")
	// ErrNotSupported: nf_tables is Linux's. On other systems the package
	// builds, so that an agent's other parts build anywhere, and New,
	// Render and every method return ErrNotSupported.
	ErrNotSupported = errors.New("nftables: not supported on this system")
	// ErrRenderOnly: a Sync or Cleanup of a Proxier made by ForRendering,
	// which holds no socket.
	ErrRenderOnly = errors.New("nftables: a Proxier for rendering only holds no socket")
)
