//go:build linux

package netnstest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
)

// Stream asks (TCP and SCTP) use non-blocking sockets made with x/sys/unix
// and wrapped in *os.File, so that reads, writes and deadlines go through
// the runtime's poller, and so that the connect can be watched for ICMP
// errors: the kernel records an ICMP error that arrives while the socket
// is busy (TCP) or always (SCTP) only as a soft error and retries, which
// SO_ERROR reports.

// connectPoll is how often a pending connect is checked for soft errors.
const connectPoll = 5 * time.Millisecond

// streamSocket opens a non-blocking stream socket of proto ("tcp" or
// "sctp") in the calling thread's namespace.
func streamSocket(proto string, v6 bool) (int, error) {
	fam, ipproto := unix.AF_INET, unix.IPPROTO_TCP
	if v6 {
		fam = unix.AF_INET6
	}
	if proto == "sctp" {
		ipproto = unix.IPPROTO_SCTP
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, ipproto)
	if err != nil {
		return -1, fmt.Errorf("%s socket: %w", proto, err)
	}
	if v6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("%s socket: IPV6_V6ONLY: %w", proto, err)
		}
	}
	return fd, nil
}

// dialStream starts a connection from the calling thread's namespace; it
// completes in waitConnected.
func dialStream(proto string, dst, from netip.AddrPort) (*os.File, error) {
	fd, err := streamSocket(proto, dst.Addr().Is6())
	if err != nil {
		return nil, err
	}
	if proto == "sctp" && (!from.IsValid() || from.Addr().IsUnspecified()) {
		// One address, whether or not a source port is asked for: an
		// SCTP socket bound to none (the wildcard) lists every address
		// of the namespace in its INIT, and a translated association's
		// peer then holds the client's untranslated addresses as paths
		// of its own. It probes them with heartbeats once its first
		// retransmission timeout passes (200 ms here, see hostSysctls);
		// those bypass the service's translation, the client knows no
		// association with the endpoint's own address and answers with
		// an ABORT, and the association dies, as it would for any
		// multihomed SCTP client behind NAT. So an ask that lasts past
		// that timeout (on a busy machine) fails. The source is the one
		// routing would pick.
		src, err := routeSource(dst.Addr())
		if err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("%s source for %s: %w", proto, dst, err)
		}
		from = netip.AddrPortFrom(src, from.Port())
	}
	if from.IsValid() {
		if from.Port() != 0 {
			unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		}
		if err := unix.Bind(fd, sockaddr.From(from)); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("%s bind %s: %w", proto, from, err)
		}
	}
	if err := unix.Connect(fd, sockaddr.From(dst)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return nil, atSocket(fmt.Errorf("%s connect %s: %w", proto, dst, err))
	}
	return os.NewFile(uintptr(fd), proto), nil
}

// connectState reports a pending connect's error, hard or soft, or
// whether it is established.
func connectState(fd int) (connected bool, err error) {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return false, err
	}
	if v != 0 {
		return false, unix.Errno(v)
	}
	_, err = unix.Getpeername(fd)
	return err == nil, nil
}

// waitConnected waits until deadline for the connection to be established
// or to fail, checking for soft errors every connectPoll.
func waitConnected(f *os.File, deadline time.Time) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for {
		slice := time.Now().Add(connectPoll)
		if slice.After(deadline) {
			slice = deadline
		}
		if err := f.SetWriteDeadline(slice); err != nil {
			return err
		}
		var connected bool
		var cerr error
		err := rc.Write(func(fd uintptr) bool {
			connected, cerr = connectState(int(fd))
			return connected || cerr != nil
		})
		switch {
		case cerr != nil:
			return cerr
		case connected:
			return nil
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return err
		case !time.Now().Before(deadline):
			return err
		}
	}
}

// askStream runs one TCP or SCTP ask: connect inside the namespace, then
// exchange.
func (h *Host) askStream(ctx context.Context, proto string, dst, from netip.AddrPort, deadline time.Time) (exchanged, error) {
	var f *os.File
	if err := h.Do(func() (err error) { f, err = dialStream(proto, dst, from); return err }); err != nil {
		return exchanged{}, err
	}
	defer f.Close()
	x := exchanged{sport: localPort(f)}
	stop := context.AfterFunc(ctx, func() { f.SetDeadline(time.Now()) })
	defer stop()
	if err := waitConnected(f, deadline); err != nil {
		return x, fmt.Errorf("%s connect %s: %w", proto, dst, err)
	}
	x.peer = peerOf(f)
	if err := f.SetDeadline(deadline); err != nil {
		return x, err
	}
	if _, err := f.Write([]byte(request)); err != nil {
		return x, fmt.Errorf("%s send: %w", proto, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 512))
	if err != nil {
		return x, fmt.Errorf("%s receive: %w", proto, err)
	}
	x.text = string(b)
	return x, nil
}

// localPort returns a connecting socket's local port (bound by connect).
func localPort(f *os.File) uint16 {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	var port uint16
	rc.Control(func(fd uintptr) {
		if sa, err := unix.Getsockname(int(fd)); err == nil {
			port = sockaddr.To(sa).Port()
		}
	})
	return port
}

// routeSource returns the source address routing picks for dst in the
// calling thread's namespace.
func routeSource(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, err
	}
	for _, r := range routes {
		if src, ok := netip.AddrFromSlice(r.Src); ok && src.IsValid() && !src.IsUnspecified() {
			return src.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no route with a source address to %s", dst)
}
