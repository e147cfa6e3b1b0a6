//go:build linux

package userspace

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// replies carries the endpoints' replies of every UDP session of the
// proxy back to their clients with one goroutine: the sessions' sockets
// are in one epoll instance, which the goroutine waits on, and it ends
// the sessions that idled for their timeout as it goes. A session costs
// its socket (which tells its replies from other clients': they come to
// its own port) and nothing that waits: no goroutine, no timer.
type replies struct {
	mu      sync.Mutex
	epfd    int // -1 while no goroutine runs
	wake    int // an eventfd in epfd: stop
	running chan struct{}
	byID    map[uint64]*session
	next    uint64
	// sweep is how often idle sessions are looked for.
	sweep time.Duration
}

// wakeID is the epoll data of the eventfd that stops the goroutine.
const wakeID = 0

// repliesBurst bounds the datagrams read from one session at a time, so
// that a busy endpoint does not hold up the others' replies.
const repliesBurst = 16

// addReplies watches s's socket, starting the goroutine if none runs; false if
// it cannot (the session must then end).
func (p *Proxier) addReplies(s *session) bool {
	r := &p.replies
	s.replies = r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		if err := r.start(p); err != nil {
			p.log.Warn("cannot wait for UDP replies", "err", err)
			return false
		}
	}
	r.next++
	s.id = r.next
	var cerr error
	err := s.s.rc.Control(func(fd uintptr) {
		cerr = unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, int(fd), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(s.id), Pad: int32(s.id >> 32)})
	})
	if err != nil || cerr != nil {
		return false
	}
	r.byID[s.id] = s
	return true
}

// forget stops watching s, whose socket is closing (the kernel takes a
// closed socket out of the epoll instance).
func (r *replies) forget(s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byID, s.id)
}

// start makes the epoll instance and starts the goroutine; r.mu is held.
func (r *replies) start(p *Proxier) error {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return err
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeID}); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return err
	}
	r.epfd, r.wake, r.running = epfd, wake, make(chan struct{})
	if r.byID == nil {
		r.byID = map[uint64]*session{}
	}
	r.sweep = min(max(p.o.UDPIdleTimeout/8, 10*time.Millisecond), time.Second)
	p.wg.Add(1)
	go p.repliesLoop(epfd, wake, r.running)
	return nil
}

// stopReplies stops the goroutine, once every session has ended.
func (p *Proxier) stopReplies() {
	r := &p.replies
	r.mu.Lock()
	running := r.running
	if running != nil {
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(r.wake, one[:])
	}
	r.running = nil
	r.mu.Unlock()
	if running != nil {
		<-running
	}
}

// repliesLoop waits for the sessions' replies until stopped.
func (p *Proxier) repliesLoop(epfd, wake int, running chan struct{}) {
	defer p.wg.Done()
	defer close(running)
	defer unix.Close(epfd)
	defer unix.Close(wake)
	events := make([]unix.EpollEvent, 256)
	buf := make([]byte, maxDatagram)
	lastSweep := time.Now()
	for {
		n, err := unix.EpollWait(epfd, events, int(p.replies.sweep/time.Millisecond))
		if err != nil && err != unix.EINTR {
			p.log.Error("waiting for UDP replies failed", "err", err)
			return
		}
		for _, ev := range events[:max(n, 0)] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if id == wakeID {
				return
			}
			p.replies.mu.Lock()
			s := p.replies.byID[id]
			p.replies.mu.Unlock()
			if s != nil {
				s.relay(buf)
			}
		}
		if now := time.Now(); now.Sub(lastSweep) >= p.replies.sweep {
			lastSweep = now
			p.endIdle(now)
		}
	}
}

// endIdle ends the sessions that have idled for their timeout.
func (p *Proxier) endIdle(now time.Time) {
	var idle []*session
	p.replies.mu.Lock()
	for _, s := range p.replies.byID {
		if t := s.act.timeout(); t > 0 && now.Sub(time.Unix(0, s.act.last.Load())) >= t {
			idle = append(idle, s)
		}
	}
	p.replies.mu.Unlock()
	for _, s := range idle {
		s.end()
	}
}

// relay sends the endpoint's waiting replies to the client from the
// listener, at most repliesBurst of them; an error the endpoint
// reported (an ICMP port unreachable) ends the session.
func (s *session) relay(buf []byte) {
	for range repliesBurst {
		var n int
		var rerr error
		if err := s.s.rc.Control(func(fd uintptr) { n, rerr = unix.Read(int(fd), buf) }); err != nil {
			return // closed
		}
		switch {
		case rerr == unix.EAGAIN || rerr == unix.EINTR:
			return
		case rerr != nil:
			s.ps.stats.dialErrors.Add(1)
			s.end()
			return
		}
		if !s.replied.Load() {
			s.replied.Store(true)
			s.l.udp.replied(s)
		}
		s.toStream()
		var werr error
		_ = s.l.rc.Control(func(fd uintptr) { werr = unix.Sendto(int(fd), buf[:n], 0, s.clientSA) })
		if werr == nil {
			s.ps.stats.bytesOut.Add(uint64(n))
			s.act.touch()
		}
	}
}
