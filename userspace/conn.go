//go:build linux

package userspace

import (
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// conn is one TCP or SCTP connection through the proxy: the client's
// socket, the one to the endpoint, and two directions moving bytes
// between them.
type conn struct {
	ps      *portState
	to      netip.AddrPort
	client  side
	backend side
	act     activity
	aborted atomic.Bool
	// drain ends the connection after Options.DrainTimeout once its
	// endpoint stopped serving; guarded by ps.mu.
	drain *time.Timer
	// upDone and downDone are set once a direction has ended (its
	// source's end of stream passed on): client to endpoint, and back.
	upDone, downDone atomic.Bool
	// handover is set while HandOver takes the connection: each direction
	// stops where its pipe is empty once its pause is set (the client's
	// first: the endpoint's answers flow until the endpoint has all the
	// client sent, so neither direction waits on the other), upQuiet is
	// closed once the client's has, quiet once both have, and the
	// connection's sockets are the handover's (see handover.go).
	handover           atomic.Bool
	pauseUp, pauseDown atomic.Bool
	upQuiet, quiet     chan struct{}
	taken              chan bool
	// ended is closed when the connection's pump returns.
	ended chan struct{}
}

// abort ends the connection with a reset on both sides.
func (c *conn) abort() {
	if c.aborted.CompareAndSwap(false, true) {
		reset(c.client.f)
		reset(c.backend.f)
	}
}

// acceptLoop accepts the connections of a TCP or SCTP listener until it
// is closed.
func (p *Proxier) acceptLoop(l *listener) {
	defer p.wg.Done()
	defer close(l.done)
	pause := time.Duration(0)
	for {
		var nfd int
		var sa unix.Sockaddr
		var aerr error
		err := l.rc.Read(func(fd uintptr) bool {
			nfd, sa, aerr = unix.Accept4(int(fd), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
			return aerr != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		switch aerr {
		case nil:
			pause = 0
		case unix.ECONNABORTED, unix.EINTR:
			continue
		case unix.EMFILE, unix.ENFILE, unix.ENOBUFS, unix.ENOMEM:
			// Out of descriptors or memory: wait for connections to end
			// rather than spin.
			p.local(l.binding.Load().port, "accept", os.NewSyscallError("accept", aerr))
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			if !l.sleep(pause) {
				return
			}
			continue
		default:
			l.broken.Store(true)
			p.broken.Add(1)
			p.log.Warn("listener failed; the next sync opens it again", "listener", l.key, "err", os.NewSyscallError("accept", aerr))
			return
		}
		cf := os.NewFile(uintptr(nfd), "")
		b := l.binding.Load()
		if !p.budget.admit(b.port) {
			p.shed(b.port)
			reset(cf)
			continue
		}
		setStreamOptions(nfd, l.key.proto)
		p.wg.Add(1)
		p.starting.Add(1)
		go p.serveStream(l, b, cf, sockaddr.To(sa))
	}
}

// serveStream forwards one accepted connection, admitted to the budget
// for b's port, or resets it.
func (p *Proxier) serveStream(l *listener, b *binding, cf *os.File, peer netip.AddrPort) {
	defer p.wg.Done()
	started := sync.OnceFunc(p.starting.Done)
	defer started()
	ps := b.port
	defer p.budget.release(ps)
	in := func() string {
		if l.key.proto == servicelb.SCTP {
			return p.routes.iface(peer.Addr())
		}
		return tcpIface(cf, peer.Addr().Is6())
	}
	d := ps.decide(p.node.Load(), b.kind, peer.Addr(), l.key.at.Addr(), in)
	if !d.action.Forwards() {
		ps.stats.refused.Add(1)
		reset(cf)
		return
	}
	bf, to, err := p.dial(ps, d, peer.Addr())
	if err != nil {
		if !localError(err) {
			ps.stats.refused.Add(1)
		}
		reset(cf)
		return
	}
	ps.stats.accepted.Add(1)
	c := newConn(ps, to)
	ok := p.openConn(c, cf, bf)
	started()
	if ok {
		p.carry(c)
	}
}

func newConn(ps *portState, to netip.AddrPort) *conn {
	return &conn{ps: ps, to: to, upQuiet: make(chan struct{}), quiet: make(chan struct{}), taken: make(chan bool, 1), ended: make(chan struct{})}
}

// openConn makes c of its client's socket cf and its endpoint's bf, and
// tracks it; false, with both reset, when it cannot.
func (p *Proxier) openConn(c *conn, cf, bf *os.File) bool {
	c.act.setTimeout(p.o.IdleTimeout)
	var e1, e2 error
	c.client, e1 = newSide(cf)
	c.backend, e2 = newSide(bf)
	if e1 != nil || e2 != nil {
		reset(cf)
		reset(bf)
		return false
	}
	if !p.track(c) {
		c.abort()
		return false
	}
	return true
}

// carry moves an open connection's bytes between its client and its
// endpoint until it ends.
func (p *Proxier) carry(c *conn) {
	ps := c.ps
	defer p.untrack(c)
	ps.stats.active.Add(1)
	defer ps.stats.active.Add(-1)
	c.act.start(c.client)
	c.act.start(c.backend)
	if ps.proto == servicelb.TCP {
		bufferNear(c.client)
		bufferNear(c.backend)
	}
	p.pump(c)
}

// pump moves the connection's bytes both ways until both ends are done,
// or aborts it at the first error of either direction, which ends the
// other at once. A connection HandOver takes stops where neither
// direction holds a byte, and its sockets go to the new process.
func (p *Proxier) pump(c *conn) {
	defer close(c.ended)
	move := func(src, dst side, count *atomic.Uint64, done, pause *atomic.Bool) {
		if done.Load() {
			return
		}
		var err error
		if c.ps.proto == servicelb.SCTP {
			err = copyMessages(src, dst, &c.act, count)
		} else {
			err = splicer{pipes: &p.pipes, act: &c.act, stall: p.o.StallTimeout, pause: pause}.run(src, dst, count)
		}
		switch {
		case err == nil:
			done.Store(true)
		case errors.Is(err, errPaused):
		default:
			c.abort()
		}
	}
	up := make(chan struct{})
	go func() {
		defer close(up)
		defer close(c.upQuiet)
		move(c.client, c.backend, &c.ps.stats.bytesIn, &c.upDone, &c.pauseUp)
	}()
	move(c.backend, c.client, &c.ps.stats.bytesOut, &c.downDone, &c.pauseDown)
	<-up
	if c.handover.Load() && !c.aborted.Load() && !(c.upDone.Load() && c.downDone.Load()) {
		close(c.quiet)
		if <-c.taken {
			return // the new process has the sockets; HandOver closed ours
		}
		c.abort()
		return
	}
	if !c.aborted.Load() {
		c.client.f.Close()
		c.backend.f.Close()
	}
}

// dial connects to an endpoint of the decision's set for client: the
// pinned one or the scheduler's pick, then, each time one fails, another
// not tried yet, up to Options.DialAttempts.
func (p *Proxier) dial(ps *portState, d decision, client netip.Addr) (*os.File, netip.AddrPort, error) {
	var tr tried
	var last error
	for range p.o.DialAttempts {
		i := choose(d, client, tr, p.now())
		if i < 0 {
			break
		}
		to := d.t.sets[d.set].backends[i].AddrPort()
		f, err := p.socks.connect(ps.proto, to, p.o.ConnectTimeout)
		if err == nil {
			return f, to, nil
		}
		if localError(err) {
			// The node's want, not the endpoint's failure: its pin
			// stays, and no other endpoint would fare better.
			p.local(ps, "connect", err)
			return nil, netip.AddrPort{}, err
		}
		last = err
		ps.stats.dialErrors.Add(1)
		if h := p.o.Hooks.DialError; h != nil {
			h(ps.key, to, err)
		}
		failed(d, client, to)
		tr = append(tr, i)
	}
	return nil, netip.AddrPort{}, last
}

// track registers an open connection with its port, for draining, and
// with the proxy, for Close; false when the proxy is closing. A
// connection whose endpoint stopped serving, or whose port went, while it
// was being made drains at once.
func (p *Proxier) track(c *conn) bool {
	p.connMu.Lock()
	if p.closing {
		p.connMu.Unlock()
		return false
	}
	p.conns[c] = struct{}{}
	p.connMu.Unlock()
	ps := c.ps
	ps.mu.Lock()
	ps.conns[c] = struct{}{}
	if ps.gone.Load() || !ps.tab.Load().sp.Serves(c.to) {
		p.startDrain(c)
	}
	ps.mu.Unlock()
	return true
}

func (p *Proxier) untrack(c *conn) {
	ps := c.ps
	ps.mu.Lock()
	delete(ps.conns, c)
	if c.drain != nil {
		c.drain.Stop()
	}
	ps.mu.Unlock()
	p.connMu.Lock()
	delete(p.conns, c)
	p.connMu.Unlock()
}

// startDrain ends c after Options.DrainTimeout, if one is set; c's port
// lock is held.
func (p *Proxier) startDrain(c *conn) {
	if c.drain != nil || p.o.DrainTimeout == 0 {
		return
	}
	c.drain = time.AfterFunc(p.o.DrainTimeout, func() {
		c.ps.stats.drained.Add(1)
		c.abort()
	})
}

// redrain starts or stops the drains of a port's connections after its
// change; its lock is not held.
func (p *Proxier) redrain(ps *portState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	sp := ps.tab.Load().sp
	gone := ps.gone.Load()
	for c := range ps.conns {
		switch {
		case gone || !sp.Serves(c.to):
			p.startDrain(c)
		case c.drain != nil:
			c.drain.Stop()
			c.drain = nil
		}
	}
}
