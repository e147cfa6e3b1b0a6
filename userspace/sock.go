//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// nsThread runs functions on one OS thread inside a network namespace, so
// that the sockets they create belong to it. A socket keeps its namespace
// wherever it is used afterwards: only creation needs the thread.
type nsThread struct {
	reqs chan func()
	done chan struct{}
}

// startNSThread starts the thread; it ends with stop. The thread never
// leaves the namespace: when stop ends its goroutine, still locked, the
// runtime ends the thread with it.
func startNSThread(ns netns.NsHandle) (*nsThread, error) {
	t := &nsThread{reqs: make(chan func()), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(t.done)
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			ready <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ready <- nil
		for f := range t.reqs {
			f()
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

// do runs f on the thread and returns when it has.
func (t *nsThread) do(f func()) {
	ran := make(chan struct{})
	t.reqs <- func() { f(); close(ran) }
	<-ran
}

func (t *nsThread) stop() {
	close(t.reqs)
	<-t.done
}

// sockets creates the proxy's sockets in its namespace.
type sockets struct {
	ns *nsThread // nil: the caller's namespace
	// redirect, when set (by tests), says where to connect instead of an
	// endpoint: a loopback stand-in for an address a test cannot have.
	redirect func(netip.AddrPort) netip.AddrPort
}

// socket returns a new non-blocking socket.
func (s *sockets) socket(family, typ, proto int) (int, error) {
	typ |= unix.SOCK_NONBLOCK | unix.SOCK_CLOEXEC
	if s.ns == nil {
		return unix.Socket(family, typ, proto)
	}
	var fd int
	var err error
	s.ns.do(func() { fd, err = unix.Socket(family, typ, proto) })
	return fd, err
}

// listenSockets makes the sockets of listeners at keys, in one trip to
// the namespace's thread: each fd, or its error.
func (s *sockets) listenSockets(keys []listenKey) ([]int, []error) {
	fds, errs := make([]int, len(keys)), make([]error, len(keys))
	mk := func() {
		for i, k := range keys {
			typ, proto := kind(k.proto)
			fds[i], errs[i] = unix.Socket(family(k.at.Addr()), typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
		}
	}
	if s.ns == nil {
		mk()
	} else {
		s.ns.do(mk)
	}
	return fds, errs
}

// kind returns the socket type and protocol number of a protocol.
func kind(p servicelb.Protocol) (typ, proto int) {
	switch p {
	case servicelb.UDP:
		return unix.SOCK_DGRAM, unix.IPPROTO_UDP
	case servicelb.SCTP:
		return unix.SOCK_STREAM, unix.IPPROTO_SCTP
	}
	return unix.SOCK_STREAM, unix.IPPROTO_TCP
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// listenBacklog is the queue of connections not accepted yet (the kernel
// caps it at net.core.somaxconn).
const listenBacklog = 4096

// listen makes socket fd (made by listenSockets, or its error) listen
// (bound, for UDP) at at, as a file in the runtime's poller.
func listen(fd int, err error, p servicelb.Protocol, at netip.AddrPort) (*os.File, error) {
	if err != nil {
		return nil, &ListenError{Protocol: p, At: at.String(), Err: os.NewSyscallError("socket", err)}
	}
	if err := setupListener(fd, p, at); err != nil {
		unix.Close(fd)
		return nil, &ListenError{Protocol: p, At: at.String(), Err: err}
	}
	return os.NewFile(uintptr(fd), p.Lower()+" "+at.String()), nil
}

func setupListener(fd int, p servicelb.Protocol, at netip.AddrPort) error {
	if at.Addr().Is6() {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return os.NewSyscallError("setsockopt IPV6_V6ONLY", err)
		}
	}
	if p == servicelb.UDP {
		// Each datagram tells the interface it came in on, for a node
		// that tells its pods so.
		level, _, ask := pktinfo(at.Addr().Is6())
		if err := unix.SetsockoptInt(fd, level, ask, 1); err != nil {
			return os.NewSyscallError("setsockopt pktinfo", err)
		}
	} else {
		// A restarted proxy binds again while the connections of the old
		// one are in TIME_WAIT.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return os.NewSyscallError("setsockopt SO_REUSEADDR", err)
		}
	}
	if err := unix.Bind(fd, sockaddr.From(at)); err != nil {
		return bindError(at, err)
	}
	if p != servicelb.UDP {
		if err := unix.Listen(fd, listenBacklog); err != nil {
			return os.NewSyscallError("listen", err)
		}
	}
	return nil
}

// errConnectTimeout: an endpoint did not answer in ConnectTimeout.
var errConnectTimeout = errors.New("connect: timed out")

// connect returns a socket of protocol p connected to to, within timeout.
func (s *sockets) connect(p servicelb.Protocol, to netip.AddrPort, timeout time.Duration) (*os.File, error) {
	if s.redirect != nil {
		to = s.redirect(to)
	}
	typ, proto := kind(p)
	fd, err := s.socket(family(to.Addr()), typ, proto)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if p != servicelb.UDP {
		setStreamOptions(fd, p)
	}
	err = unix.Connect(fd, sockaddr.From(to))
	if err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	// The socket joins the poller after connect, so that the poller
	// reports it writable only once the connection is made.
	f := os.NewFile(uintptr(fd), p.Lower()+" "+to.String())
	if err == nil {
		return f, nil
	}
	if err := waitConnected(f, timeout); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// waitConnected waits for a non-blocking connect to finish.
func waitConnected(f *os.File, timeout time.Duration) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	if err := f.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	var cerr error
	err = rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		switch {
		case err != nil:
			cerr = err
		case v == 0:
			// The poller may wake us early: only a peer makes it done.
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false
			}
		case syscall.Errno(v) == unix.EINPROGRESS || syscall.Errno(v) == unix.EALREADY:
			return false
		default:
			cerr = syscall.Errno(v)
		}
		return true
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errConnectTimeout
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return os.NewSyscallError("connect", err)
	}
	return f.SetWriteDeadline(time.Time{})
}

// setStreamOptions tunes a TCP or SCTP socket: no Nagle delay (the proxy
// forwards what it has at once) and, for TCP, keepalives, so that dead
// peers are found. Failures only cost performance (or, for SCTP, the
// messages' streams).
func setStreamOptions(fd int, p servicelb.Protocol) {
	if p == servicelb.SCTP {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_SCTP, sctpNoDelay, 1)
		// Each message comes with its stream and protocol identifier,
		// which the proxy sends it on with.
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_SCTP, sctpRecvRcvInfo, 1)
		subscribeAssocChange(fd)
		return
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15)
}

// reset closes a stream socket with a reset (an SCTP abort) instead of
// an orderly end.
func reset(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		})
	}
	f.Close()
}

// bindError is the error of a bind of at: a port below the kernel's
// unprivileged start refused for lack of privilege wants
// CAP_NET_BIND_SERVICE, not CAP_NET_ADMIN, and says so while it still
// matches servicelb.ErrPermission.
func bindError(at netip.AddrPort, err error) error {
	if errors.Is(err, unix.EACCES) {
		return &bindPermissionError{at: at, err: os.NewSyscallError("bind", err)}
	}
	return os.NewSyscallError("bind", err)
}

type bindPermissionError struct {
	at  netip.AddrPort
	err error
}

func (e *bindPermissionError) Error() string {
	return fmt.Sprintf("%s %v: port %d needs CAP_NET_BIND_SERVICE (or a lower net.ipv4.ip_unprivileged_port_start)",
		e.at, e.err, e.at.Port())
}

func (e *bindPermissionError) Unwrap() []error { return []error{e.err, servicelb.ErrPermission} }
