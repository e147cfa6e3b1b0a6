package privilege

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Capabilities the backends need.
const (
	NetAdmin  = unix.CAP_NET_ADMIN
	SysAdmin  = unix.CAP_SYS_ADMIN
	SysPtrace = unix.CAP_SYS_PTRACE
)

var capNames = map[int]string{NetAdmin: "CAP_NET_ADMIN", SysAdmin: "CAP_SYS_ADMIN", SysPtrace: "CAP_SYS_PTRACE"}

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
