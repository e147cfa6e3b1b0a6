//go:build privileged || vm

package sockdiag_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
	"github.com/kproxy-dev/kproxy/internal/sockdiag"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestDestroyEndsAConnectedUDPSocket: a connected UDP socket of the node's
// namespace, IPv4, IPv6 and a dual-stack one with an IPv4 peer, is listed
// with its addresses and ended from outside: its next receive fails with
// ECONNABORTED. The same name with another cookie ends nothing.
func TestDestroyEndsAConnectedUDPSocket(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "udp", 8080)
	for _, c := range []struct {
		name   string
		family int
		peer   netip.Addr
	}{
		{"ipv4", unix.AF_INET, netnstest.BackendIPv4(0)},
		{"ipv6", unix.AF_INET6, netnstest.BackendIPv6(0)},
		{"dual-stack", unix.AF_INET6, netnstest.BackendIPv4(0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var fd int
			require.NoError(t, tp.Node.Do(func() (err error) {
				fd, err = unix.Socket(c.family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
				return err
			}))
			defer unix.Close(fd)
			peer := netip.AddrPortFrom(c.peer, 8080)
			if c.family == unix.AF_INET6 {
				peer = netip.AddrPortFrom(netip.AddrFrom16(c.peer.As16()), 8080)
			}
			require.NoError(t, unix.Connect(fd, sockaddr.From(peer)))
			cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
			require.NoError(t, err)
			diag, err := sockdiag.Open(int(tp.Node.NS))
			require.NoError(t, err)
			defer diag.Close()
			listed, err := diag.List(t.Context(), unix.IPPROTO_UDP, 1<<sockdiag.Established)
			require.NoError(t, err)
			i := slices.IndexFunc(listed, func(s sockdiag.Socket) bool { return s.Cookie == cookie })
			require.NotEqual(t, -1, i, "socket %d is not among the connected UDP sockets listed: %v", cookie, listed)
			s := listed[i]
			assert.Equal(t, c.family, s.Family)
			assert.Equal(t, unix.IPPROTO_UDP, s.Protocol)
			assert.Equal(t, netip.AddrPortFrom(c.peer, 8080), s.Peer)
			local, err := unix.Getsockname(fd)
			require.NoError(t, err)
			assert.Equal(t, sockaddr.To(local), s.Local)

			other := s
			other.Cookie++
			assert.ErrorIs(t, diag.Destroy(t.Context(), other), unix.ENOENT, "a socket with another cookie")
			_, err = unix.Getpeername(fd)
			require.NoError(t, err, "the socket lost its peer to a destruction that named another cookie")

			require.NoError(t, diag.Destroy(t.Context(), s))
			tv := unix.NsecToTimeval(int64(time.Second))
			require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
			_, _, err = unix.Recvfrom(fd, make([]byte, 64), 0)
			assert.ErrorIs(t, err, unix.ECONNABORTED)
			_, err = unix.Getpeername(fd)
			assert.ErrorIs(t, err, unix.ENOTCONN, "the ended socket still has its peer")
		})
	}
}
