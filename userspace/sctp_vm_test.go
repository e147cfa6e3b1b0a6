//go:build vm

package userspace

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestSCTPMessages: SCTP crosses the proxy message by message, each on
// its stream with its payload protocol identifier, both ways; and an
// association that ends from either side ends through the proxy.
func TestSCTPMessages(t *testing.T) {
	netnstest.Require(t, "sctp", "veth")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	serveSCTPEcho(t, tp.Backends[0], 9000)
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/sig", ClusterIPs: addrs("10.96.0.10"),
		Ports:     []servicelb.Port{{Protocol: servicelb.SCTP, Port: 38412, TargetPort: 9000}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}}}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))

	th, err := startNSThread(tp.Client.NS)
	require.NoError(t, err)
	defer th.stop()
	c, err := (&sockets{ns: th}).connect(servicelb.SCTP, netip.MustParseAddrPort("10.96.0.10:38412"), 5*time.Second)
	require.NoError(t, err)
	cs, err := newSide(c)
	require.NoError(t, err)
	for i, m := range []struct {
		sid  uint16
		ppid [4]byte
		text string
	}{{0, [4]byte{0, 0, 0, 60}, "first"}, {3, [4]byte{0, 0, 0, 46}, "second"}, {1, [4]byte{9, 9, 9, 9}, strings.Repeat("x", 3000)}} {
		require.NoError(t, sendMessage(cs, []byte(m.text), sndInfoCmsg(m.sid, 0, m.ppid), &activity{}))
		sid, ppid, text := recvMessage(t, c)
		assert.Equal(t, m.sid, sid, "message %d", i)
		assert.Equal(t, m.ppid, ppid, "message %d", i)
		assert.Equal(t, fmt.Sprintf("echo %d %x %s", m.sid, m.ppid, m.text), text, "message %d", i)
	}
	require.NoError(t, shutdownWrite(cs))
	require.Eventually(t, func() bool { return p.activeConns() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the association outlived its client's end")
	c.Close()
}

// recvMessage reads one message with its stream and identifier.
func recvMessage(t *testing.T, f *os.File) (uint16, [4]byte, string) {
	t.Helper()
	rc, err := f.SyscallConn()
	require.NoError(t, err)
	f.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf, oob := make([]byte, 1<<16), make([]byte, 256)
	var n, oobn, flags int
	var rerr error
	for {
		err = rc.Read(func(fd uintptr) bool {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		})
		require.NoError(t, err)
		require.NoError(t, rerr)
		if flags&msgNotification == 0 {
			break
		}
	}
	sid, ppid, ok := rcvInfo(oob[:oobn])
	require.True(t, ok, "no receive information")
	return sid, ppid, string(buf[:n])
}

// serveSCTPEcho answers each message on an endpoint host with "echo
// <stream> <ppid> <message>", on the message's stream with its
// identifier, and ends the association after its client does.
func serveSCTPEcho(t *testing.T, h *netnstest.Host, port uint16) {
	var fd int
	require.NoError(t, h.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP); err != nil {
			return err
		}
		if err = unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return err
		}
		return unix.Listen(fd, 16)
	}))
	ln := os.NewFile(uintptr(fd), "sctp listener")
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nfd, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
			if err != nil {
				return
			}
			_ = unix.SetsockoptInt(nfd, unix.IPPROTO_SCTP, sctpRecvRcvInfo, 1)
			go func() {
				defer unix.Close(nfd)
				buf, oob := make([]byte, 1<<16), make([]byte, 256)
				for {
					n, oobn, _, _, err := unix.Recvmsg(nfd, buf, oob, 0)
					if err != nil || n == 0 {
						return
					}
					sid, ppid, _ := rcvInfo(oob[:oobn])
					reply := fmt.Sprintf("echo %d %x %s", sid, ppid, buf[:n])
					if _, err := unix.SendmsgN(nfd, []byte(reply), sndInfoCmsg(sid, 0, ppid), nil, 0); err != nil {
						return
					}
				}
			}()
		}
	}()
}
