//go:build linux

package userspace

import (
	"container/list"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
)

// maxDatagram is the largest UDP payload the proxy carries.
const maxDatagram = 1 << 16

// sessions are the UDP sessions of one listener, by client address and
// port. Those that have had no reply yet are also in unreplied, oldest
// first: when the proxy can hold no more sessions, the oldest of them
// makes room for a new client, as conntrack drops its unreplied entries
// first when its table is full, so that a flood of clients that get no
// answer cannot keep the others out.
type sessions struct {
	mu        sync.Mutex
	m         map[netip.AddrPort]*session
	unreplied list.List // of *session
	closed    bool
}

func newSessions() *sessions { return &sessions{m: map[netip.AddrPort]*session{}} }

// session is one UDP client of a listener: a socket connected to the
// endpoint it reached, which its datagrams go out through and its
// replies come back on, to be sent to the client from the listener, so
// that they come from the address the client sent to.
type session struct {
	l        *listener
	ps       *portState
	budget   *budget // the flow budget it is counted in
	client   netip.AddrPort
	clientSA unix.Sockaddr
	to       netip.AddrPort
	s        side
	act      activity
	ended    bool          // guarded by l.udp.mu
	waiting  *list.Element // in l.udp.unreplied until the first reply; guarded by l.udp.mu
	// start is when the session began; replied is set at the endpoint's
	// first reply, stream once a datagram either way comes after it and
	// streamAfter from the start (see stream).
	start           time.Time
	replied, stream atomic.Bool
	streamTimeout   time.Duration
	// id names the session to replies, which waits for its endpoint's
	// replies once it is set.
	id      uint64
	replies *replies
}

// streamAfter is how long after its start a UDP flow that has had a
// reply becomes a stream, as conntrack says (nf_conntrack_proto_udp).
const streamAfter = 2 * time.Second

// toStream makes the session a stream, with Options.UDPStreamTimeout, once
// it has had a reply and carries a datagram streamAfter from its start or
// later: conntrack's assured UDP flow, which keeps its entry for
// nf_conntrack_udp_timeout_stream (120 s) where a flow of a datagram and
// its answer keeps it for nf_conntrack_udp_timeout (30 s).
func (s *session) toStream() {
	if s.replied.Load() && !s.stream.Load() && time.Since(s.start) >= streamAfter && s.stream.CompareAndSwap(false, true) {
		s.act.setTimeout(s.streamTimeout)
	}
}

func (ss *sessions) get(client netip.AddrPort) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.m[client]
}

func (ss *sessions) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}

// add adds a session; false once the listener is closed.
func (ss *sessions) add(s *session) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	ss.m[s.client] = s
	s.waiting = ss.unreplied.PushBack(s)
	return true
}

// replied takes s off the unreplied list, at its first reply.
func (ss *sessions) replied(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s.waiting != nil {
		ss.unreplied.Remove(s.waiting)
		s.waiting = nil
	}
}

// unlink takes s out of the table and the unreplied list; ss.mu is held.
func (ss *sessions) unlink(s *session) {
	s.ended = true
	delete(ss.m, s.client)
	if s.waiting != nil {
		ss.unreplied.Remove(s.waiting)
		s.waiting = nil
	}
}

// evict ends the oldest session that has had no reply, and reports
// whether there was one.
func (ss *sessions) evict() bool {
	ss.mu.Lock()
	e := ss.unreplied.Front()
	if e == nil {
		ss.mu.Unlock()
		return false
	}
	s := e.Value.(*session)
	ss.unlink(s)
	ss.mu.Unlock()
	s.closed()
	s.ps.stats.evicted.Add(1)
	return true
}

// remove removes s, and reports whether it was there.
func (ss *sessions) remove(s *session) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s.ended {
		return false
	}
	ss.unlink(s)
	return true
}

// closeIf ends the sessions that match. They
// leave the table before their sockets close, so that their clients'
// next datagrams start new sessions at once, never meeting a closed one.
func (ss *sessions) closeIf(match func(*session) bool) int {
	ss.mu.Lock()
	var out []*session
	for _, s := range ss.m {
		if match(s) {
			out = append(out, s)
		}
	}
	for _, s := range out {
		ss.unlink(s)
	}
	ss.mu.Unlock()
	for _, s := range out {
		s.closed()
	}
	return len(out)
}

// closeAll ends every session, for good.
func (ss *sessions) closeAll() {
	ss.mu.Lock()
	ss.closed = true
	ss.mu.Unlock()
	ss.closeIf(func(*session) bool { return true })
}

// udpLoop reads a UDP listener's datagrams and sends each on through its
// client's session, made at its first datagram.
func (p *Proxier) udpLoop(l *listener) {
	defer p.wg.Done()
	defer close(l.done)
	buf := make([]byte, maxDatagram)
	oob := make([]byte, 64) // IP_PKTINFO, IPV6_PKTINFO
	for {
		var n, oobn int
		var from unix.Sockaddr
		var rerr error
		err := l.rc.Read(func(fd uintptr) bool {
			n, oobn, _, from, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		if rerr != nil {
			continue
		}
		client := sockaddr.To(from)
		// A session that ended since the lookup (a sync found its
		// endpoint stale) takes no datagram: the client starts anew.
		if s := l.udp.get(client); s != nil && s.forward(buf[:n]) {
			continue
		}
		in := func() string {
			var name string
			_ = l.rc.Control(func(fd uintptr) { name = ifaceName(int(fd), pktinfoIndex(oob[:oobn], l.key.at.Addr().Is6())) })
			return name
		}
		if s := p.newSession(l, client, from, in); s != nil {
			s.forward(buf[:n])
		}
	}
}

// newSession decides a new client's flow and, when it forwards, connects
// a socket to an endpoint, whose replies replies waits for; else the
// datagram is dropped (a UDP reject is the kernel's: no listener). in
// names the interface the datagram came in on.
func (p *Proxier) newSession(l *listener, client netip.AddrPort, sa unix.Sockaddr, in func() string) *session {
	b := l.binding.Load()
	ps := b.port
	d := ps.decide(p.node.Load(), b.kind, client.Addr(), l.key.at.Addr(), in)
	if !d.action.Forwards() {
		ps.stats.refused.Add(1)
		return nil
	}
	// A full table, or budget, makes room by ending the listener's
	// oldest session that has had no reply, if it has one.
	if l.udp.len() >= p.o.MaxUDPSessions && !l.udp.evict() {
		ps.stats.sessionsDropped.Add(1)
		return nil
	}
	if !p.budget.admit(ps) && (!l.udp.evict() || !p.budget.admit(ps)) {
		p.shed(ps)
		return nil
	}
	f, to, err := p.dial(ps, d, client.Addr())
	if err != nil {
		if !localError(err) {
			ps.stats.refused.Add(1)
		}
		p.budget.release(ps)
		return nil
	}
	sd, err := newSide(f)
	if err != nil {
		f.Close()
		p.budget.release(ps)
		return nil
	}
	s := &session{l: l, ps: ps, budget: &p.budget, client: client, clientSA: sa, to: to, s: sd,
		start: time.Now(), streamTimeout: p.o.UDPStreamTimeout}
	s.act.setTimeout(p.o.UDPIdleTimeout)
	if !l.udp.add(s) {
		f.Close()
		p.budget.release(ps)
		return nil
	}
	ps.stats.accepted.Add(1)
	ps.stats.active.Add(1)
	s.act.touch()
	if !p.addReplies(s) {
		s.end()
		return nil
	}
	// A sync that ran since the decision closes the sessions to
	// endpoints that stopped serving; this one was not there yet.
	if ps.gone.Load() || !ps.tab.Load().sp.Serves(to) {
		s.end()
		return nil
	}
	return s
}

// forward sends one datagram of the client to the endpoint, and reports
// false when the session has ended instead, leaving the datagram to a
// new one. A datagram that finds the socket's buffer full is dropped, as
// the network would; an error the endpoint reported (an ICMP port
// unreachable for an earlier datagram) ends the session, so that this
// datagram finds an endpoint again.
func (s *session) forward(b []byte) bool {
	var werr error
	err := s.s.rc.Control(func(fd uintptr) { _, werr = unix.Write(int(fd), b) })
	switch {
	case err != nil:
		return false
	case werr == unix.EAGAIN:
	case werr != nil:
		s.ps.stats.dialErrors.Add(1)
		s.end()
		return false
	default:
		s.ps.stats.bytesIn.Add(uint64(len(b)))
		s.act.touch()
		s.toStream()
	}
	return true
}

// end removes the session and closes its socket.
func (s *session) end() {
	if s.l.udp.remove(s) {
		s.closed()
		return
	}
	s.s.f.Close()
}

// closed counts a session out, once it has left the table, and closes
// its socket.
func (s *session) closed() {
	if s.replies != nil {
		s.replies.forget(s)
	}
	s.ps.stats.active.Add(-1)
	s.budget.release(s.ps)
	s.s.f.Close()
}
