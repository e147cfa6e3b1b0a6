//go:build privileged

package netnstest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestICMPFoundWhenReadLate: an ICMP error queued before the ask's reader
// runs is found however late the reader runs (a busy machine or an
// emulated guest delays it past its wait); one about another flow is not.
func TestICMPFoundWhenReadLate(t *testing.T) {
	Require(t, "root")
	h := NewHost(t, "icmplate")
	dst := netip.MustParseAddrPort("127.0.0.1:9")
	// unreachable sends a datagram from port sport to a port nobody holds
	// on the host's own loopback: the kernel answers with a port
	// unreachable, which a watch opened before queues.
	unreachable := func(sport uint16) {
		t.Helper()
		require.NoError(t, h.Do(func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(sport), Addr: [4]byte{127, 0, 0, 1}}); err != nil {
				return err
			}
			return unix.Sendto(fd, []byte("x"), 0, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()})
		}))
	}

	w, err := h.watchICMP(false)
	require.NoError(t, err)
	defer w.close()
	unreachable(40001)
	time.Sleep(2 * icmpWait) // the reader runs late
	e := w.find(flowID{unix.IPPROTO_UDP, 40001, dst}, time.Now().Add(-time.Second))
	require.NotNil(t, e, "an error queued in time was not found by a reader that ran late")
	assert.True(t, e.PortUnreachable(), "%v", e)

	other, err := h.watchICMP(false)
	require.NoError(t, err)
	defer other.close()
	unreachable(40002)
	assert.Nil(t, other.find(flowID{unix.IPPROTO_UDP, 40003, dst}, time.Now().Add(icmpWait)), "an error about another flow")
}
