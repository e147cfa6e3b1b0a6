//go:build privileged || vm

package ipset_test

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"golang.org/x/sys/unix"
)

// The getsockopt interface iptables uses to turn a set name into its
// index (include/uapi/linux/netfilter/ipset/ip_set.h): an independent way
// to read the index for checking Client.Index.
const (
	soIPSet        = 83
	opVersion      = 0x100
	opGetByName    = 6
	ipsetMaxNameLn = 32
)

type reqGetSet struct {
	op      uint32
	version uint32
	name    [ipsetMaxNameLn]byte // union: the name in, the u16 index out
}

func getsockopt(fd int, req unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_IP, soIPSet, uintptr(req), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func sockoptIndex(t *testing.T, h *netnstest.Host, name string) uint16 {
	t.Helper()
	var index uint16
	err := h.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ver := [2]uint32{opVersion, 0}
		if err := getsockopt(fd, unsafe.Pointer(&ver), unsafe.Sizeof(ver)); err != nil {
			return fmt.Errorf("IP_SET_OP_VERSION: %w", err)
		}
		req := reqGetSet{op: opGetByName, version: ver[1]}
		copy(req.name[:], name)
		if err := getsockopt(fd, unsafe.Pointer(&req), unsafe.Sizeof(req)); err != nil {
			return fmt.Errorf("IP_SET_OP_GET_BYNAME: %w", err)
		}
		index = *(*uint16)(unsafe.Pointer(&req.name[0]))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if index == 0xffff {
		t.Fatalf("getsockopt: no set %s", name)
	}
	return index
}
