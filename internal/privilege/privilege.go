// Package privilege makes the kernel's refusals for lack of privilege
// (EPERM, EACCES) say so: every backend wraps its errors with Check, so
// that a caller without CAP_NET_ADMIN learns what is missing, and can test
// for it with errors.Is(err, servicelb.ErrPermission).
package privilege

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Check returns err, wrapped with servicelb.ErrPermission when the kernel
// refused it for lack of privilege; nil stays nil.
func Check(err error) error {
	if err == nil || errors.Is(err, servicelb.ErrPermission) {
		return err
	}
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("%w (%w)", err, servicelb.ErrPermission)
	}
	return err
}
