package ipvs

import (
	"context"
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Errors. Every error the package returns wraps one of these, or is a
// *servicelb.ValidationError (what the State asks that the proxier cannot
// do, as servicelb.Capabilities.CheckPort reports it: ErrUnsupported,
// ErrCapacity), or a context error, so that callers test the kind with
// errors.Is.
var (
	// ErrNotSupported: IPVS is Linux's. On other systems the package
	// builds so that programs importing it compile, and New, Render and
	// every method return ErrNotSupported.
	ErrNotSupported = servicelb.ErrNotSupported
	// ErrInvalidOptions: an Options field is not valid.
	ErrInvalidOptions = servicelb.ErrInvalidOptions
	// ErrConflict: a virtual server a service needs exists and belongs to
	// someone else (the service is left out, the error inside a
	// *servicelb.ValidationError naming it), or, which servicelb rules
	// out, two service ports need the same one.
	ErrConflict = errors.New("virtual server conflict")
	// ErrIPVSUnavailable: the kernel has no IPVS (hint: load the ip_vs
	// module and the schedulers' ip_vs_* modules).
	ErrIPVSUnavailable = errors.New("ipvs not available (is the ip_vs module loaded?)")
	// ErrLinkConflict: a link with the Interface name exists and is not a
	// dummy link.
	ErrLinkConflict = servicelb.ErrLinkConflict
	// ErrSysctl: a sysctl the proxier needs cannot be written, or differs
	// with Options.LeaveSysctls set.
	ErrSysctl = errors.New("sysctl")
	// ErrKernel: a netlink operation failed; the OpError says which.
	ErrKernel = servicelb.ErrKernel
	// ErrClosed: the Proxier was closed.
	ErrClosed = servicelb.ErrClosed
	// ErrRenderOnly: a Sync or Cleanup of a Proxier made by ForRendering,
	// which holds no socket.
	ErrRenderOnly = servicelb.ErrRenderOnly
)

// OpError is a failed kernel operation: what was done to which object.
type OpError struct {
	// Op is the operation, such as "add virtual server".
	Op string
	// Object names the kernel object, such as "-t 10.96.0.10:80".
	Object string
	// Err is the kernel's error.
	Err error
}

func (e *OpError) Error() string {
	if e.Object == "" {
		return fmt.Sprintf("%s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("%s %s: %v", e.Op, e.Object, e.Err)
}

// Unwrap returns the kernel's error and ErrKernel.
func (e *OpError) Unwrap() []error {
	if errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, context.DeadlineExceeded) {
		return []error{e.Err}
	}
	return []error{e.Err, ErrKernel}
}

func opErr(op, object string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Object: object, Err: err}
}
