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

// Feature classifies the error of a request a backend's Probe makes to
// find out whether the kernel has feature: nil stays nil; a refusal for
// lack of privilege is wrapped with servicelb.ErrPermission, as Check
// does; any other error is a *servicelb.FeatureError naming feature, with
// hint, wrapping it.
func Feature(err error, feature, hint string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES):
		return Check(err)
	}
	return &servicelb.FeatureError{Feature: feature, Hint: hint, Err: err}
}
