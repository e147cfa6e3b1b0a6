//go:build linux

package userspace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Handover. A proxy restarted or upgraded would cut every connection
// through it, which ends with its process. Instead the new process asks
// the old one, over a Unix socket (SOCK_SEQPACKET), for its sockets, as
// Envoy's hot restart and systemd's socket passing hand sockets on:
//
//  1. The new Proxier (Options.TakeOver) says hello; the old one's
//     HandOver sends each listening socket, and goes on accepting from
//     them.
//  2. The new Proxier's first Sync serves with them, then it says ready,
//     and the old one stops accepting.
//  3. HandOver waits for the connections it accepted to be made to their
//     endpoints, then stops the TCP connections a few at a time, each
//     where neither direction holds a byte in the proxy, and sends its two
//     sockets, its service port and endpoint, and which directions have
//     ended; the new Proxier carries each on from there, and says so
//     (handoverWindow bounds the connections held still at once). The
//     bytes in the sockets' buffers stay there, so nothing is lost or
//     sent twice.
//
// What is not handed over: SCTP connections and UDP sessions (a UDP
// client's next datagram starts a new session in the new process), and a
// connection that does not go quiet within handoverQuiet (one whose
// receiver takes nothing), which HandOver resets. The held addresses stay
// on the link, and the new Proxier adopts them as a restarted one does.

// handoverQuiet bounds the wait for a connection to go quiet: a moment
// on a machine at ease, seconds on an emulated one that is busy.
const handoverQuiet = 10 * time.Second

// handoverWindow is how many connections HandOver has in hand at once:
// stopping, or sent and not yet acknowledged by the new process. A
// connection is held still from its stop until the new process carries it
// on, so the window bounds that time to a few connections' handling,
// however many there are.
const handoverWindow = 8

// ErrHandover: a handover between two processes failed. The old Proxier
// serves on with what it did not hand over.
var ErrHandover = errors.New("handover failed")

// Handover counts what HandOver handed over.
type Handover struct {
	// Listeners are the listening sockets handed over.
	Listeners int
	// Conns are the TCP connections handed over; Reset those that did
	// not go quiet in time and were reset.
	Conns, Reset int
}

// handoverMsg is one message of the handover, with the descriptors its
// op carries.
type handoverMsg struct {
	Op string `json:"op"`
	// A hello's: the new process says it acknowledges each connection
	// (op "took") once it carries it on or has passed it over. A process
	// that does not say so (v0.1.0) is sent every connection at once.
	Acks bool `json:"acks,omitempty"`
	// A listener's (op "listener", one descriptor).
	Proto servicelb.Protocol `json:"proto,omitempty"`
	At    netip.AddrPort     `json:"at,omitzero"`
	// A connection's (op "conn", the client's socket and the
	// endpoint's).
	Port             servicelb.ServicePortKey `json:"port,omitzero"`
	To               netip.AddrPort           `json:"to,omitzero"`
	UpDone, DownDone bool                     `json:",omitempty"`
}

const (
	opHello     = "hello"
	opListener  = "listener"
	opListeners = "listeners-done"
	opReady     = "ready"
	opConn      = "conn"
	opTook      = "took"
	opDone      = "done"
)

func sendHandover(c *net.UnixConn, m handoverMsg, fds ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

func recvHandover(c *net.UnixConn) (handoverMsg, []int, error) {
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return handoverMsg{}, nil, err
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return handoverMsg{}, nil, err
		}
		for _, cm := range msgs {
			got, err := unix.ParseUnixRights(&cm)
			if err != nil {
				return handoverMsg{}, nil, err
			}
			fds = append(fds, got...)
		}
	}
	var m handoverMsg
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeFDs(fds)
		return handoverMsg{}, nil, err
	}
	return m, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// fdOf returns f's descriptor without taking it from the runtime.
func fdOf(f *os.File) int {
	fd := -1
	if rc, err := f.SyscallConn(); err == nil {
		_ = rc.Control(func(u uintptr) { fd = int(u) })
	}
	return fd
}

// HandOver gives the proxy's listening sockets and TCP connections to a
// new Proxier in another process that asks for them over c (see
// Options.TakeOver), so that a restart or an upgrade cuts none of them:
// see the package documentation. This proxy accepts new connections
// until the new one's first sync is in, and hands them over with the
// others. Afterwards the Proxier serves only what it did not hand over
// (UDP sessions, SCTP connections) until Close; it serves no sync. ctx
// bounds the whole exchange. On failure before the new Proxier said it
// serves, the proxy serves on as before.
func (p *Proxier) HandOver(ctx context.Context, c *net.UnixConn) (Handover, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var h Handover
	if p.closed {
		return h, ErrClosed
	}
	if p.renderOnly {
		return h, ErrRenderOnly
	}
	fail := func(step string, err error) (Handover, error) {
		return h, fmt.Errorf("userspace: %w: %s: %w", ErrHandover, step, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	hello, fds, err := recvHandover(c)
	if err != nil || hello.Op != opHello {
		closeFDs(fds)
		return fail("hello", errors.Join(err, unexpected(hello.Op, opHello)))
	}
	acks := hello.Acks
	// The listening sockets go to the new process while this one goes
	// on accepting from them, until the new one serves with them too:
	// a connection either accepts is served, by the new process or by
	// this one, which then hands it over with the others.
	keys := slices.SortedFunc(mapKeys(p.listeners), func(a, b listenKey) int { return a.at.Compare(b.at) })
	for _, k := range keys {
		l := p.listeners[k]
		if err := sendHandover(c, handoverMsg{Op: opListener, Proto: k.proto, At: k.at}, fdOf(l.f)); err != nil {
			return fail("listener "+k.String(), err)
		}
	}
	if err := sendHandover(c, handoverMsg{Op: opListeners}); err != nil {
		return fail("listeners", err)
	}
	if m, fds, err := recvHandover(c); err != nil || m.Op != opReady {
		closeFDs(fds)
		return fail("ready", errors.Join(err, unexpected(m.Op, opReady)))
	}
	p.log.Debug("handover: the new process serves")
	// The new process serves: this one's copies of the listeners go.
	for _, k := range keys {
		l := p.listeners[k]
		l.pause()
		l.f.Close()
		if l.udp != nil {
			l.udp.closeAll()
		}
		delete(p.listeners, k)
	}
	h.Listeners = len(keys)
	p.handedOver = true
	// A connection accepted before is handed over with the others once
	// it is open: wait for those still being made to their endpoint (a
	// connection this proxy kept would end with it).
	p.waitStarting(ctx)
	p.connMu.Lock()
	var conns []*conn
	for cn := range p.conns {
		if cn.ps.proto == servicelb.TCP {
			conns = append(conns, cn)
		}
	}
	p.connMu.Unlock()
	p.log.Debug("handover: connections accepted are open", "connections", len(conns))
	// The connections stop and go over a few at a time: at most
	// handoverWindow are stopping, or sent and not yet carried on by the
	// new process (when it says so), so that each is held still only for a
	// few connections' handling, however many there are and however
	// slowly the new process takes them. One sent to a process that does
	// not acknowledge is done with at once.
	stopped := make(chan stopResult)
	next, inFlight, unacked := 0, 0, 0
	var errs []error
	for next < len(conns) || inFlight > 0 {
		if next < len(conns) && inFlight < handoverWindow {
			cn := conns[next]
			next++
			inFlight++
			go func() { stopped <- cn.stopForHandover(ctx) }()
			continue
		}
		if unacked > 0 && (inFlight == unacked || len(errs) > 0) {
			// Only connections sent are in flight: wait for the first to
			// be taken.
			if err := recvTook(c); err != nil && len(errs) == 0 {
				errs = append(errs, err)
			}
			unacked--
			inFlight--
			continue
		}
		r := <-stopped
		cn := r.c
		switch {
		case r.state == stopEnded:
			inFlight--
			continue
		case r.state == stopStuck || len(errs) > 0:
			cn.taken <- false
			h.Reset++
			inFlight--
			continue
		}
		m := handoverMsg{Op: opConn, Port: cn.ps.key, To: cn.to, UpDone: cn.upDone.Load(), DownDone: cn.downDone.Load()}
		if err := sendHandover(c, m, fdOf(cn.client.f), fdOf(cn.backend.f)); err != nil {
			errs = append(errs, err)
			cn.taken <- false
			h.Reset++
			inFlight--
			continue
		}
		cn.client.f.Close()
		cn.backend.f.Close()
		cn.taken <- true
		h.Conns++
		if acks {
			unacked++
		} else {
			inFlight--
		}
	}
	if err := sendHandover(c, handoverMsg{Op: opDone}); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fail("connections", err)
	}
	p.log.Info("handed over", "listeners", h.Listeners, "connections", h.Conns, "reset", h.Reset)
	return h, nil
}

// waitStarting returns once no accepted connection is being made to its
// endpoint, or after handoverQuiet, or when ctx ends; the listeners are
// closed.
func (p *Proxier) waitStarting(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, handoverQuiet)
	defer cancel()
	started := make(chan struct{})
	go func() {
		p.starting.Wait()
		close(started)
	}()
	select {
	case <-started:
	case <-ctx.Done():
	}
}

// stopState is how a connection's stop for a handover ended.
type stopState int

const (
	stopQuiet stopState = iota // neither direction holds a byte: it can go
	stopEnded                  // it ended meanwhile
	stopStuck                  // it did not go quiet within handoverQuiet
)

type stopResult struct {
	c     *conn
	state stopState
}

// stopForHandover stops both directions of c where neither holds a byte
// in the proxy: the client's first, then the endpoint's, once the
// endpoint has answered all the client sent (so neither waits on the
// other).
func (c *conn) stopForHandover(ctx context.Context) stopResult {
	ctx, cancel := context.WithTimeout(ctx, handoverQuiet)
	defer cancel()
	c.handover.Store(true)
	c.pauseUp.Store(true)
	_ = c.client.f.SetReadDeadline(time.Now())
	select {
	case <-c.upQuiet:
	case <-c.ended:
	case <-ctx.Done():
	}
	c.pauseDown.Store(true)
	_ = c.backend.f.SetReadDeadline(time.Now())
	select {
	case <-c.quiet:
		return stopResult{c, stopQuiet}
	case <-c.ended:
		return stopResult{c, stopEnded}
	case <-ctx.Done():
		return stopResult{c, stopStuck}
	}
}

// recvTook reads the new process's acknowledgement of a connection.
func recvTook(c *net.UnixConn) error {
	m, fds, err := recvHandover(c)
	closeFDs(fds)
	if err != nil {
		return err
	}
	if m.Op != opTook || len(fds) > 0 {
		return fmt.Errorf("unexpected %q with %d descriptors, want %q", m.Op, len(fds), opTook)
	}
	return nil
}

func unexpected(got, want string) error {
	if got == want || got == "" {
		return nil
	}
	return fmt.Errorf("got %q, want %q", got, want)
}

// pause stops the listener's goroutine and keeps its socket.
func (l *listener) pause() {
	_ = l.f.SetReadDeadline(time.Now())
	<-l.done
}

// takeListeners asks the old process for its listening sockets, which
// the first sync serves with instead of opening its own.
func (p *Proxier) takeListeners(c *net.UnixConn) error {
	if err := sendHandover(c, handoverMsg{Op: opHello, Acks: true}); err != nil {
		return err
	}
	p.inherited = map[listenKey]int{}
	for {
		m, fds, err := recvHandover(c)
		if err != nil {
			return err
		}
		switch {
		case m.Op == opListeners:
			return nil
		case m.Op == opListener && len(fds) == 1:
			k := listenKey{proto: m.Proto, at: m.At}
			if err := checkListener(fds[0], k); err != nil {
				unix.Close(fds[0])
				return fmt.Errorf("listener %s: %w", k, err)
			}
			p.inherited[k] = fds[0]
		default:
			closeFDs(fds)
			return fmt.Errorf("unexpected %q with %d descriptors", m.Op, len(fds))
		}
	}
}

// takeConns, after the first sync, closes the listening sockets it did
// not need, says ready, and carries on the connections the old process
// sends, acknowledging each.
func (p *Proxier) takeConns(c *net.UnixConn) (int, error) {
	for _, fd := range p.inherited {
		unix.Close(fd)
	}
	p.inherited = nil
	if err := sendHandover(c, handoverMsg{Op: opReady}); err != nil {
		return 0, err
	}
	n := 0
	for {
		m, fds, err := recvHandover(c)
		if err != nil {
			return n, err
		}
		switch {
		case m.Op == opDone:
			return n, nil
		case m.Op == opConn && len(fds) == 2:
			if p.takeConn(m, fds[0], fds[1]) {
				n++
			}
			if err := sendHandover(c, handoverMsg{Op: opTook}); err != nil {
				return n, err
			}
		default:
			closeFDs(fds)
			return n, fmt.Errorf("unexpected %q with %d descriptors", m.Op, len(fds))
		}
	}
}

// takeConn carries on a connection the old process sent, with its
// client's socket cfd and its endpoint's bfd; false when it passed it
// over. A connection of a service port the sync left out is reset.
func (p *Proxier) takeConn(m handoverMsg, cfd, bfd int) bool {
	if err := errors.Join(checkConn(cfd), checkConn(bfd)); err != nil {
		if errors.Is(err, errGone) {
			// The client or the endpoint left during the handover.
			p.log.Debug("handover: a connection ended", "port", m.Port, "err", err)
		} else {
			p.log.Warn("handover: passed over a connection", "port", m.Port, "err", err)
		}
		closeFDs([]int{cfd, bfd})
		return false
	}
	cf, bf := os.NewFile(uintptr(cfd), "client"), os.NewFile(uintptr(bfd), "endpoint")
	ps := p.ports[m.Port]
	if ps == nil || ps.proto != servicelb.TCP || !p.budget.admit(ps) {
		reset(cf)
		reset(bf)
		return false
	}
	cn := newConn(ps, m.To)
	cn.upDone.Store(m.UpDone)
	cn.downDone.Store(m.DownDone)
	if !p.openConn(cn, cf, bf) {
		p.budget.release(ps)
		return false
	}
	ps.stats.adopted.Add(1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.budget.release(ps)
		p.carry(cn)
	}()
	return true
}

// errGone: a TCP socket handed over is no longer connected; its peer
// left.
var errGone = errors.New("the socket is not connected")

// checkListener returns an error unless fd is a socket of k's protocol
// bound to k's address, and listening for a protocol with connections:
// an older process's word is not taken for what its descriptors are.
func checkListener(fd int, k listenKey) error {
	typ, proto := kind(k.proto)
	if err := checkSocket(fd, typ, proto); err != nil {
		return err
	}
	if typ == unix.SOCK_STREAM {
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on == 0 {
			return errors.New("the socket does not listen")
		}
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return err
	}
	if at := sockaddr.To(sa); at != k.at {
		return fmt.Errorf("the socket is bound to %s", at)
	}
	return nil
}

// checkConn returns an error unless fd is a connected TCP socket;
// errGone for a TCP socket whose peer left.
func checkConn(fd int) error {
	if err := checkSocket(fd, unix.SOCK_STREAM, unix.IPPROTO_TCP); err != nil {
		return err
	}
	if _, err := unix.Getpeername(fd); err != nil {
		return fmt.Errorf("%w: %w", errGone, err)
	}
	return nil
}

// checkSocket returns an error unless fd is a socket of type typ and
// protocol proto.
func checkSocket(fd, typ, proto int) error {
	gotTyp, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("not a socket: %w", err)
	}
	gotProto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return fmt.Errorf("not a socket: %w", err)
	}
	if gotTyp != typ || gotProto != proto {
		return fmt.Errorf("a socket of type %d and protocol %d, want type %d and protocol %d", gotTyp, gotProto, typ, proto)
	}
	return nil
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
