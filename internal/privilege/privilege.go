// Package privilege makes the kernel's refusals for lack of privilege
// (EPERM, EACCES) say so: every backend wraps its errors with Check, so
// that a caller without CAP_NET_ADMIN learns what is missing, and can test
// for it with errors.Is(err, servicelb.ErrPermission).
package privilege

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

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

// Capabilities the backends need.
const (
	NetAdmin = unix.CAP_NET_ADMIN
	SysAdmin = unix.CAP_SYS_ADMIN
)

var capNames = map[int]string{NetAdmin: "CAP_NET_ADMIN", SysAdmin: "CAP_SYS_ADMIN"}

// Require returns an error wrapping servicelb.ErrPermission that names
// the capabilities of caps the process lacks in its effective set, or nil.
// what says what needs them.
func Require(what string, caps ...int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil // unknown: let the kernel decide
	}
	var missing []string
	for _, c := range caps {
		if data[c/32].Effective&(1<<(c%32)) == 0 {
			missing = append(missing, capNames[c])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s needs %s, which the process does not have: %w", what, strings.Join(missing, " and "), servicelb.ErrPermission)
}
