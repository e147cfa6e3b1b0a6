package ipset

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors to test with errors.Is.
var (
	// ErrInvalid: a set description or entry was rejected before anything
	// was sent to the kernel (SetError and EntryError match it).
	ErrInvalid = errors.New("invalid")
	// ErrNotExist: the set does not exist.
	ErrNotExist = errors.New("set does not exist")
	// ErrExist: a set of that name already exists.
	ErrExist = errors.New("set already exists")
	// ErrIncompatible: a set of that name exists with another type,
	// family or options (see Client.Ensure).
	ErrIncompatible = errors.New("set exists with other settings")
	// ErrInUse: the set is referenced (by an iptables rule or a list set)
	// and cannot be destroyed.
	ErrInUse = errors.New("set is in use")
	// ErrNotSupported: the kernel lacks ipset or the set type (the
	// ip_set and ip_set_<type> modules).
	ErrNotSupported = errors.New("not supported by the kernel (ip_set modules not loaded?)")
)

// SetError is an invalid set description or name.
type SetError struct {
	Set    string
	Reason string
}

func (e *SetError) Error() string { return fmt.Sprintf("set %q: %s", e.Set, e.Reason) }

// Is makes SetError match ErrInvalid.
func (e *SetError) Is(target error) bool { return target == ErrInvalid }

// EntryError is an entry that does not fit its set.
type EntryError struct {
	Set    string
	Entry  Entry
	Reason string
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("set %q: entry %s: %s", e.Set, e.Entry, e.Reason)
}

// Is makes EntryError match ErrInvalid.
func (e *EntryError) Is(target error) bool { return target == ErrInvalid }

// KernelError is an error number the kernel's ipset answered.
type KernelError struct {
	Errno syscall.Errno
}

func (e *KernelError) Error() string {
	if s, ok := kernelErrors[int(e.Errno)]; ok {
		return fmt.Sprintf("%s (ipset error %d)", s, int(e.Errno))
	}
	return e.Errno.Error()
}

// Unwrap returns the errno, so that errors.Is(err, syscall.ENOENT) works.
func (e *KernelError) Unwrap() error { return e.Errno }

// OpError is a failed operation on a set: "ipset add KUBE-CLUSTER-IP: ...".
type OpError struct {
	Op  string // create, destroy, flush, list, add, del, test, type, protocol
	Set string // the kernel name (with the prefix); empty for operations on no set
	Err error
}

func (e *OpError) Error() string {
	if e.Set == "" {
		return "ipset " + e.Op + ": " + e.Err.Error()
	}
	return "ipset " + e.Op + " " + e.Set + ": " + e.Err.Error()
}

func (e *OpError) Unwrap() error { return e.Err }

// kernelError turns a netlink error into errors the package's callers can
// test: ErrNotExist, ErrExist, ErrInUse and ErrNotSupported join the
// KernelError where they apply.
func kernelError(op, set string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return &OpError{Op: op, Set: set, Err: err}
	}
	ke := &KernelError{Errno: errno}
	var sentinel error
	switch {
	case errno == syscall.ENOENT:
		sentinel = ErrNotExist
	case errno == syscall.EEXIST || (op == "create" && errno == errExist):
		sentinel = ErrExist
	case errno == errBusy || errno == errReferenced:
		sentinel = ErrInUse
	case errno == syscall.EPROTONOSUPPORT || errno == errFindType:
		sentinel = ErrNotSupported
	}
	if sentinel == nil {
		return &OpError{Op: op, Set: set, Err: ke}
	}
	return &OpError{Op: op, Set: set, Err: fmt.Errorf("%w: %w", sentinel, ke)}
}
