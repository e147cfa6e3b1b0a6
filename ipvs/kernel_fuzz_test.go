//go:build linux

package ipvs

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/ipvsnl"
)

// FuzzFromService: the conversion of a virtual server as the kernel lists
// it never panics, and what it accepts converts back to the same service:
// a restarted proxier recognises every virtual server it wrote.
func FuzzFromService(f *testing.F) {
	f.Add([]byte{10, 96, 0, 10}, uint16(unix.IPPROTO_TCP), uint16(80), uint32(0), uint16(unix.AF_INET), uint32(0), uint32(0), "wrr")
	f.Add([]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(unix.IPPROTO_UDP), uint16(53), uint32(0), uint16(unix.AF_INET6), uint32(ipvsnl.FlagPersistent), uint32(10800), "rr")
	f.Add([]byte{}, uint16(0), uint16(0), uint32(0x10000), uint16(unix.AF_INET), uint32(ipvsnl.FlagSched2), uint32(0), "mh")
	f.Fuzz(func(t *testing.T, addr []byte, proto, port uint16, mark uint32, af uint16, flags, timeout uint32, sched string) {
		a, _ := netip.AddrFromSlice(addr)
		s := &ipvsnl.Service{Addr: a, Protocol: proto, Port: port, FWMark: mark, Family: af,
			Flags: flags, Timeout: timeout, Scheduler: sched}
		vs, ok := fromService(s)
		if !ok {
			return
		}
		back, ok := fromService(toService(vs))
		require.True(t, ok, "%+v does not convert back", vs)
		require.Equal(t, vs, back)
	})
}
