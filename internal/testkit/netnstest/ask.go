//go:build linux

package netnstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
)

// The kinds of failed asks, for errors.Is.
var (
	// ErrRefused: the destination answered no: a TCP reset, an SCTP
	// abort, or an ICMP destination unreachable (port, host, network,
	// administratively prohibited).
	ErrRefused = errors.New("refused")
	// ErrTimeout: silence until the deadline, as when packets are dropped.
	ErrTimeout = errors.New("timed out")
	// ErrFiltered: the asking host's own netfilter output hooks dropped or
	// rejected the ask as it left (the kernel fails the send with EPERM):
	// what a drop or reject looks like to a datagram sent from the host
	// that runs the rules. With WatchICMP, AskError.ICMP tells a reject,
	// whose ICMP error comes back to the host, from a drop.
	ErrFiltered = errors.New("filtered on the way out")
)

// DefaultTimeout bounds an ask without a Timeout option.
const DefaultTimeout = time.Second

// AnswerTimeout bounds each ask of a Count that expects every ask answered
// (without CountFailures or Timeout). On a busy machine, or an emulated
// one, an answer can come later than DefaultTimeout, and it is still an
// answer; asks that may meet silence keep DefaultTimeout, which is how
// long they wait for it.
const AnswerTimeout = 10 * time.Second

// Keys under which Count with CountFailures counts failed asks.
const (
	KeyRefused  = "refused"
	KeyTimeout  = "timeout"
	KeyFiltered = "filtered"
	KeyError    = "error"
)

// Reply is an echo server's answer.
type Reply struct {
	// Host is the name of the host that answered.
	Host string
	// Client is the client's address and port as the server saw them:
	// the client's own when its source address is preserved, the node's
	// when it is masqueraded.
	Client netip.AddrPort
	// Port is the port the server answered on; 0 from a server that
	// does not say.
	Port uint16
}

// AskError is a failed ask. errors.Is(err, ErrRefused) and
// errors.Is(err, ErrTimeout) tell the kinds apart; the underlying error
// (for example syscall.ECONNREFUSED) is wrapped too.
type AskError struct {
	Proto string
	Dst   netip.AddrPort
	// Kind is ErrRefused, ErrTimeout, or nil for other failures (bad
	// arguments, a malformed reply, a cancelled context).
	Kind error
	Err  error
	// ICMP is the ICMP error about the ask that reached the asking host,
	// when the ask was made with WatchICMP; nil when none came (a TCP
	// reset or an SCTP abort refused it, or the ask timed out).
	ICMP *ICMPError
	// AtSocket reports that the asking socket's connect failed at once,
	// before any packet left: what a socket-level load balancer's hooks
	// give for a flow they refuse (ECONNREFUSED) or drop (EPERM).
	AtSocket bool
}

func (e *AskError) Error() string {
	if e.Kind != nil {
		return fmt.Sprintf("ask %s %s: %v: %v", e.Proto, e.Dst, e.Kind, e.Err)
	}
	return fmt.Sprintf("ask %s %s: %v", e.Proto, e.Dst, e.Err)
}

func (e *AskError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// AskOption changes how Ask and Count ask.
type AskOption func(*askConfig)

type askConfig struct {
	timeout       time.Duration
	timeoutSet    bool
	from          netip.Addr
	fromPort      uint16
	countFailures bool
	watchICMP     bool
	cgroup        *Cgroup
	unconnected   bool
	keep          string
	connected     bool
	peer          *netip.AddrPort
}

// Timeout bounds each ask (connection and exchange); the default is
// DefaultTimeout.
func Timeout(d time.Duration) AskOption {
	return func(c *askConfig) { c.timeout, c.timeoutSet = d, true }
}

// FromAddr sets the source address of the asks; it must be an address of
// the asking host (see Host.AddAddress) of the destination's family.
func FromAddr(a netip.Addr) AskOption { return func(c *askConfig) { c.from = a } }

// FromPort sets the source port of the asks (with SO_REUSEADDR).
func FromPort(p uint16) AskOption { return func(c *askConfig) { c.fromPort = p } }

// WatchICMP makes a failed ask report the ICMP error about it that reached
// the asking host (AskError.ICMP), so that a test tells an ICMP port
// unreachable from a TCP reset: both refuse a connection alike.
func WatchICMP() AskOption { return func(c *askConfig) { c.watchICMP = true } }

// Unconnected makes a UDP ask from an unconnected socket: sendto(2) and
// recvfrom(2) instead of connect(2), send and receive.
func Unconnected() AskOption { return func(c *askConfig) { c.unconnected = true } }

// KeepSocket makes an Unconnected UDP ask from a socket kept under name in
// the asking process (the test's, or the cgroup's with InCgroup) for the
// asks with that name after it, as one client's session sends from one
// socket: the first ask makes it (with its FromAddr and FromPort), and it
// lives until the host is removed or the cgroup's process ends. A socket
// of its own is one flow to a socket-level load balancer, whatever its
// destinations.
func KeepSocket(name string) AskOption {
	return func(c *askConfig) { c.unconnected, c.keep, c.connected = true, name, false }
}

// KeepConnected makes a UDP ask from a connected socket kept under name
// (and the destination) in the asking process, as KeepSocket does for an
// unconnected one: a client that connects once and sends on. A kept
// socket that a proxy ended (SocketEnded) is forgotten with that ask's
// failure, and the next ask under the name connects again.
func KeepConnected(name string) AskOption {
	return func(c *askConfig) { c.unconnected, c.keep, c.connected = false, name, true }
}

// Peer stores in *p the server as the asking socket saw it:
// getpeername(2) of the connected socket, or with Unconnected the source
// recvfrom(2) gave the UDP answer.
func Peer(p *netip.AddrPort) AskOption { return func(c *askConfig) { c.peer = p } }

// CountFailures makes Count count failed asks under KeyRefused,
// KeyTimeout, KeyFiltered and KeyError instead of failing the test.
func CountFailures() AskOption { return func(c *askConfig) { c.countFailures = true } }

func newAskConfig(opts []AskOption) askConfig {
	c := askConfig{timeout: DefaultTimeout}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// source returns the local address to bind, or the zero value.
func (c *askConfig) source(dst netip.AddrPort) (netip.AddrPort, error) {
	if !c.from.IsValid() && c.fromPort == 0 {
		return netip.AddrPort{}, nil
	}
	a := c.from
	if !a.IsValid() {
		a = netip.IPv4Unspecified()
		if dst.Addr().Is6() {
			a = netip.IPv6Unspecified()
		}
	}
	if a.Is4() != dst.Addr().Is4() {
		return netip.AddrPort{}, fmt.Errorf("source %s and destination %s differ in family", a, dst.Addr())
	}
	return netip.AddrPortFrom(a, c.fromPort), nil
}

// Ask makes one fresh connection (TCP, SCTP) or sends one datagram from a
// fresh socket (UDP) from the host to dst, and returns the echo server's
// reply. Failures are *AskError; see ErrRefused and ErrTimeout.
func (h *Host) Ask(ctx context.Context, proto string, dst netip.AddrPort, opts ...AskOption) (Reply, error) {
	cfg := newAskConfig(opts)
	fail := func(kind, err error) (Reply, error) {
		return Reply{}, &AskError{Proto: proto, Dst: dst, Kind: kind, Err: err}
	}
	if !dst.IsValid() || dst.Port() == 0 {
		return fail(nil, errors.New("invalid destination"))
	}
	from, err := cfg.source(dst)
	if err != nil {
		return fail(nil, err)
	}
	deadline := time.Now().Add(cfg.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var w *icmpWatch
	if cfg.watchICMP {
		if w, err = h.watchICMP(dst.Addr().Is6()); err != nil {
			return fail(nil, err)
		}
		defer w.close()
	}
	if proto != "udp" && proto != "tcp" && proto != "sctp" {
		return fail(nil, fmt.Errorf("unknown protocol %q (want tcp, udp or sctp)", proto))
	}
	var x exchanged
	if cfg.cgroup != nil {
		x, err = cfg.cgroup.exchange(ctx, h, proto, dst, from, deadline, udpAsk{cfg.unconnected, cfg.keep, cfg.connected})
	} else {
		x, err = h.exchange(ctx, proto, dst, from, deadline, udpAsk{cfg.unconnected, cfg.keep, cfg.connected})
	}
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fail(nil, errors.Join(ctx.Err(), err))
		}
		e := &AskError{Proto: proto, Dst: dst, Kind: classify(err), Err: err, AtSocket: errors.Is(err, errAtSocket)}
		if w != nil {
			e.ICMP = w.find(flowID{protoNumber(proto), x.sport, dst}, time.Now().Add(icmpWait))
		}
		return Reply{}, e
	}
	r, err := parseReply(x.text)
	if err != nil {
		return fail(nil, err)
	}
	if cfg.peer != nil {
		*cfg.peer = x.peer
	}
	return r, nil
}

// exchanged is what an ask's socket learnt: the answer, its own port and
// its peer.
type exchanged struct {
	text  string
	sport uint16
	peer  netip.AddrPort
}

// udpAsk says how a UDP ask sends: from a connected socket or an
// unconnected one, made for the ask or kept under a name (KeepSocket,
// KeepConnected).
type udpAsk struct {
	Unconnected bool   `json:"unconnected,omitempty"`
	Keep        string `json:"keep,omitempty"`
	Connected   bool   `json:"connected,omitempty"`
}

// exchange runs one ask from a socket of the calling process.
func (h *Host) exchange(ctx context.Context, proto string, dst, from netip.AddrPort, deadline time.Time, u udpAsk) (exchanged, error) {
	switch {
	case proto == "udp" && u.Unconnected:
		return h.askUDPUnconnected(ctx, dst, from, deadline, u.Keep)
	case proto == "udp" && u.Connected:
		return h.askUDP(ctx, dst, from, deadline, u.Keep)
	case proto == "udp":
		return h.askUDP(ctx, dst, from, deadline, "")
	}
	return h.askStream(ctx, proto, dst, from, deadline)
}

// errAtSocket marks the failure of a connect that sent nothing.
var errAtSocket = errors.New("failed at the socket")

type socketError struct{ err error }

func (e *socketError) Error() string   { return e.err.Error() }
func (e *socketError) Unwrap() []error { return []error{e.err, errAtSocket} }

func atSocket(err error) error { return &socketError{err} }

// askUDP runs one UDP ask from a connected socket, which the kernel tells
// about ICMP errors: made for the ask, or with keep the one kept under
// keep and dst, made the first time. The socket is created inside the
// namespace; the exchange runs outside it.
func (h *Host) askUDP(ctx context.Context, dst, from netip.AddrPort, deadline time.Time, keep string) (exchanged, error) {
	key := "connected " + dst.String() + " " + keep
	var c *net.UDPConn
	if keep != "" {
		h.mu.Lock()
		c, _ = h.kept[key].(*net.UDPConn)
		h.mu.Unlock()
	}
	if c == nil {
		d := net.Dialer{Deadline: deadline}
		if from.IsValid() {
			d.LocalAddr = net.UDPAddrFromAddrPort(from)
			if from.Port() != 0 {
				d.Control = reuseAddr
			}
		}
		var nc net.Conn
		if err := h.Do(func() (err error) { nc, err = d.DialContext(ctx, "udp", dst.String()); return err }); err != nil {
			// A UDP connect sends nothing: its failure is the socket's own.
			return exchanged{}, atSocket(err)
		}
		c = nc.(*net.UDPConn)
		if keep != "" {
			h.mu.Lock()
			if h.kept == nil {
				h.kept = map[string]net.PacketConn{}
			}
			h.kept[key] = c
			h.mu.Unlock()
		}
	}
	if keep == "" {
		defer c.Close()
	}
	x := exchanged{sport: uint16(c.LocalAddr().(*net.UDPAddr).Port), peer: peerOf(c)}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	err := c.SetDeadline(deadline)
	if err == nil {
		_, err = c.Write([]byte(request))
	}
	if err == nil {
		buf := make([]byte, 512)
		var n int
		n, err = c.Read(buf)
		x.text = string(buf[:n])
	}
	if keep != "" && SocketEnded(err) {
		h.mu.Lock()
		if h.kept[key] == c {
			delete(h.kept, key)
		}
		h.mu.Unlock()
		c.Close()
	}
	return x, err
}

// SocketEnded reports whether an ask from a kept connected socket failed
// because something ended the socket (as `ss -K` does): its receive failed
// with ECONNABORTED, or its send found it without its peer.
func SocketEnded(err error) bool {
	return errors.Is(err, unix.ECONNABORTED) || errors.Is(err, unix.EDESTADDRREQ)
}

// askUDPUnconnected runs one UDP ask from an unconnected socket, made for
// it or kept under keep.
func (h *Host) askUDPUnconnected(ctx context.Context, dst, from netip.AddrPort, deadline time.Time, keep string) (exchanged, error) {
	network := "udp4"
	if dst.Addr().Is6() {
		network = "udp6"
	}
	c, err := h.udpSocket(ctx, network, from, keep)
	if err != nil {
		return exchanged{}, err
	}
	if keep == "" {
		defer c.Close()
	}
	x := exchanged{sport: uint16(c.LocalAddr().(*net.UDPAddr).Port)}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := c.SetDeadline(deadline); err != nil {
		return x, err
	}
	if _, err := c.WriteTo([]byte(request), net.UDPAddrFromAddrPort(dst)); err != nil {
		// An unconnected send fails at once or not at all.
		return x, atSocket(err)
	}
	buf := make([]byte, 512)
	n, src, err := c.ReadFrom(buf)
	x.text = string(buf[:n])
	if ua, ok := src.(*net.UDPAddr); ok {
		x.peer = ua.AddrPort()
		x.peer = netip.AddrPortFrom(x.peer.Addr().Unmap(), x.peer.Port())
	}
	return x, err
}

// udpSocket returns a new unconnected UDP socket bound to from (any
// address and port when zero), or with keep the one kept under that name
// and network, made the first time.
func (h *Host) udpSocket(ctx context.Context, network string, from netip.AddrPort, keep string) (net.PacketConn, error) {
	key := network + " " + keep
	if keep != "" {
		h.mu.Lock()
		c := h.kept[key]
		h.mu.Unlock()
		if c != nil {
			return c, nil
		}
	}
	lc := net.ListenConfig{}
	if from.Port() != 0 {
		lc.Control = reuseAddr
	}
	laddr := ":0"
	if from.IsValid() {
		laddr = from.String()
	}
	var c net.PacketConn
	if err := h.Do(func() (err error) { c, err = lc.ListenPacket(ctx, network, laddr); return err }); err != nil {
		return nil, err
	}
	if keep != "" {
		h.mu.Lock()
		defer h.mu.Unlock()
		if other := h.kept[key]; other != nil {
			c.Close()
			return other, nil
		}
		if h.kept == nil {
			h.kept = map[string]net.PacketConn{}
		}
		h.kept[key] = c
	}
	return c, nil
}

// peerOf returns a connected socket's peer, as getpeername(2) gives it.
func peerOf(c syscall.Conn) netip.AddrPort {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}
	}
	var peer netip.AddrPort
	rc.Control(func(fd uintptr) {
		if sa, err := unix.Getpeername(int(fd)); err == nil {
			peer = sockaddr.To(sa)
		}
	})
	return peer
}

// protoNumber returns the IP protocol number of "tcp", "udp" or "sctp".
func protoNumber(proto string) uint8 {
	return map[string]uint8{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}[proto]
}

func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	})
	return errors.Join(err, serr)
}

// classify returns ErrRefused, ErrTimeout or nil for a failed exchange.
func classify(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, unix.ETIMEDOUT), errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	case errors.Is(err, unix.EPERM):
		return ErrFiltered
	case errors.Is(err, unix.ECONNREFUSED), errors.Is(err, unix.ECONNRESET),
		errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH),
		errors.Is(err, unix.EACCES), errors.Is(err, unix.EPIPE):
		return ErrRefused
	}
	return nil
}

// parseReply parses "<host name> <client addr:port>".
func parseReply(text string) (Reply, error) {
	f := strings.Fields(text)
	if len(f) < 2 || len(f) > 3 || strings.HasPrefix(text, " ") {
		return Reply{}, fmt.Errorf("malformed reply %q", text)
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("malformed reply %q: %w", text, err)
	}
	r := Reply{Host: f[0], Client: ap}
	if len(f) == 3 {
		port, err := strconv.ParseUint(f[2], 10, 16)
		if err != nil {
			return Reply{}, fmt.Errorf("malformed reply %q: port: %w", text, err)
		}
		r.Port = uint16(port)
	}
	return r, nil
}

// failureKey returns the Count key of a failed ask.
func failureKey(err error) string {
	switch {
	case errors.Is(err, ErrRefused):
		return KeyRefused
	case errors.Is(err, ErrTimeout):
		return KeyTimeout
	case errors.Is(err, ErrFiltered):
		return KeyFiltered
	}
	return KeyError
}

// Count makes n asks, one after the other, each on a fresh connection or
// socket, and returns how many each host answered, by host name. A failed
// ask fails the test unless the CountFailures option is given; then each
// ask waits up to AnswerTimeout for its answer, unless Timeout says
// otherwise. Call it from the test's goroutine.
func (h *Host) Count(t testing.TB, proto string, dst netip.AddrPort, n int, opts ...AskOption) map[string]int {
	t.Helper()
	cfg := newAskConfig(opts)
	if !cfg.countFailures && !cfg.timeoutSet {
		opts = append(slices.Clip(opts), Timeout(AnswerTimeout))
	}
	counts := map[string]int{}
	for i := range n {
		r, err := h.Ask(context.Background(), proto, dst, opts...)
		if err != nil {
			if !cfg.countFailures {
				t.Fatalf("netnstest: %s: ask %d of %d: %v (answers so far: %v)", h.Name, i+1, n, err, counts)
			}
			counts[failureKey(err)]++
			continue
		}
		counts[r.Host]++
	}
	return counts
}
