package userspace

import (
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Errors. Every error the package returns wraps one of these, or is a
// *servicelb.ValidationError naming the service the proxy left out (what
// its Capabilities refuse; a frontend it cannot listen on, wrapping a
// *ListenError), or a context error, so that callers test the kind with
// errors.Is.
var (
	// ErrNotSupported: the system cannot run the proxy (it needs Linux).
	ErrNotSupported = servicelb.ErrNotSupported
	// ErrInvalidOptions: an Options field is not valid.
	ErrInvalidOptions = servicelb.ErrInvalidOptions
	// ErrClosed: the Proxier was closed.
	ErrClosed = servicelb.ErrClosed
	// ErrRenderOnly: a Sync or Cleanup of a Proxier made by ForRendering.
	ErrRenderOnly = servicelb.ErrRenderOnly
	// ErrKernel: a netlink operation on the addresses or the link
	// failed; the OpError says which.
	ErrKernel = servicelb.ErrKernel
	// ErrLinkConflict: Options.Link names a link that is neither the
	// loopback nor a dummy link.
	ErrLinkConflict = servicelb.ErrLinkConflict
	// ErrNoAddressMark: the kernel does not keep the protocol the proxy
	// marks its addresses with (IFA_PROTO, Linux 5.18).
	ErrNoAddressMark = errors.New("kernel keeps no address protocol (IFA_PROTO needs Linux 5.18)")
)

// OpError is a failed kernel operation: what was done to which object.
type OpError struct {
	// Op is the operation, such as "add address".
	Op string
	// Object names the kernel object, such as "10.96.0.10/32 on lo".
	Object string
	// Err is the kernel's error.
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Object, e.Err) }

// Unwrap returns the kernel's error and ErrKernel.
func (e *OpError) Unwrap() []error { return []error{e.Err, ErrKernel} }

// ListenError is a frontend the proxy could not listen on: its address is
// not the node's (hint: Options.HoldAddresses, or Options.Listen), someone
// else listens there, or the port is privileged. The service is left out
// (a *servicelb.ValidationError naming it wraps the ListenError, and
// servicelb.ErrFrontendTaken when the address is in use) and the rest
// applied; the next sync tries again once the service changes.
type ListenError struct {
	Protocol servicelb.Protocol
	At       string
	Err      error
}

func (e *ListenError) Error() string {
	return fmt.Sprintf("listen %s %s: %v", e.Protocol.Lower(), e.At, e.Err)
}

func (e *ListenError) Unwrap() error { return e.Err }
