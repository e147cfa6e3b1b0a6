//go:build linux

package userspace

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pipe is a kernel pipe that splice(2) moves bytes through, from one
// socket to another, without copying them to user space.
type pipe struct{ r, w int }

// pipePool keeps the pipes of the transfers under way, and a few spare
// ones. A direction of a connection holds a pipe only while bytes are in
// it, so an idle connection holds none: the pipes in use follow the
// transfers under way, not the connections open (each pipe costs two
// file descriptors, and an unprivileged user's pipes beyond
// fs.pipe-user-pages-soft shrink to two pages).
type pipePool struct {
	mu   sync.Mutex
	free []*pipe
	size int // the pipe buffer size asked for
}

// Pipe sizes: pipeSize is asked for each pipe (the kernel's default is
// 64 KiB, and 1 MiB the most an unprivileged process may ask for, as Go's
// io.Copy does); maxSplice bounds the bytes one splice(2) moves; spare
// bounds the idle pipes kept (the kernel counts a pipe's size against its
// user's pipe-user-pages-soft while it exists, pages or not). Measured on
// a 1 GiB stream over loopback on two busy cores, 1 MiB pipes moved it
// 1.3-2x as fast as 256 KiB ones, in half the system calls.
const (
	pipeSize  = 1 << 20
	maxSplice = 1 << 20
	spare     = 16
)

func (pp *pipePool) get() (*pipe, error) {
	pp.mu.Lock()
	if n := len(pp.free); n > 0 {
		p := pp.free[n-1]
		pp.free = pp.free[:n-1]
		pp.mu.Unlock()
		return p, nil
	}
	pp.mu.Unlock()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	if pp.size > 0 {
		// A smaller pipe only costs more system calls.
		_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, pp.size)
	}
	return &pipe{r: fds[0], w: fds[1]}, nil
}

// put returns an empty pipe to the pool.
func (pp *pipePool) put(p *pipe) {
	pp.mu.Lock()
	if len(pp.free) < spare {
		pp.free = append(pp.free, p)
		p = nil
	}
	pp.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// discard closes a pipe that may hold bytes.
func (pp *pipePool) discard(p *pipe) { p.close() }

func (p *pipe) close() {
	unix.Close(p.r)
	unix.Close(p.w)
}

func (pp *pipePool) close() {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range pp.free {
		p.close()
	}
	pp.free = nil
}

// side is one socket of a connection.
type side struct {
	f  *os.File
	rc syscall.RawConn
}

func newSide(f *os.File) (side, error) {
	rc, err := f.SyscallConn()
	return side{f: f, rc: rc}, err
}

// errIdle: a connection moved no data for Options.IdleTimeout.
var errIdle = errors.New("idle timeout")

// errStalled: the receiver of bytes the proxy held took none of them for
// Options.StallTimeout.
var errStalled = errors.New("stalled transfer")

// activity is when a connection last moved data, and how long it may
// idle: both directions share it, so that one busy direction keeps the
// other's wait alive.
type activity struct {
	last atomic.Int64 // Unix nanoseconds
	idle atomic.Int64 // a time.Duration; a UDP session's grows once it is a stream
}

// timeout returns how long the connection may idle; zero for ever.
func (a *activity) timeout() time.Duration { return time.Duration(a.idle.Load()) }

// setTimeout sets how long the connection may idle; zero for ever.
func (a *activity) setTimeout(d time.Duration) { a.idle.Store(int64(d)) }

func (a *activity) touch() {
	if a.timeout() > 0 {
		a.last.Store(time.Now().UnixNano())
	}
}

// start sets the first deadlines of a side.
func (a *activity) start(s side) {
	idle := a.timeout()
	if idle == 0 {
		return
	}
	a.touch()
	d := time.Now().Add(idle)
	_ = s.f.SetReadDeadline(d)
	_ = s.f.SetWriteDeadline(d)
}

// expired is called when a wait on s passed its deadline: it reports
// whether the connection has been idle for its timeout, or else moves the
// deadline to the timeout after the last activity.
func (a *activity) expired(s side, read bool) bool {
	idle := a.timeout()
	if idle == 0 {
		return true
	}
	next := time.Unix(0, a.last.Load()).Add(idle)
	if !time.Now().Before(next) {
		return true
	}
	if read {
		_ = s.f.SetReadDeadline(next)
	} else {
		_ = s.f.SetWriteDeadline(next)
	}
	return false
}

// splicer moves the bytes of one direction of a connection.
type splicer struct {
	pipes *pipePool
	act   *activity
	// stall is Options.StallTimeout; zero for none.
	stall time.Duration
	// pause, when set, makes run return errPaused where its pipe is
	// empty (HandOver).
	pause *atomic.Bool
}

// errPaused: a direction stopped for HandOver, with no byte in its pipe.
var errPaused = errors.New("paused for handover")

func (s splicer) paused() bool { return s.pause != nil && s.pause.Load() }

// run moves src's bytes to dst until src ends, then ends dst's writing
// side (the half-close travels on), adding each batch moved to count. It
// returns the first error of either socket.
func (s splicer) run(src, dst side, count *atomic.Uint64) error {
	var p *pipe
	defer func() {
		if p != nil {
			s.pipes.put(p)
		}
	}()
	for {
		n, err := s.fill(src, &p)
		if err != nil {
			return err
		}
		if n == 0 {
			return shutdownWrite(dst)
		}
		if err := s.drain(dst, p, n); err != nil {
			s.pipes.discard(p)
			p = nil
			return err
		}
		count.Add(uint64(n))
		s.act.touch()
		if s.paused() {
			return errPaused
		}
	}
}

// fill waits for src to have bytes and moves them into a pipe, taken from
// the pool only once there is something to move. It returns 0 at the end
// of src.
func (s splicer) fill(src side, pp **pipe) (int, error) {
	for {
		var n int64
		var serr error
		err := src.rc.Read(func(fd uintptr) bool {
			if *pp == nil {
				if *pp, serr = s.pipes.get(); serr != nil {
					return true
				}
			}
			n, serr = unix.Splice(int(fd), nil, (*pp).w, nil, maxSplice, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
			if serr == unix.EAGAIN {
				s.pipes.put(*pp) // nothing to move: wait without a pipe
				*pp = nil
				return false
			}
			return true
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if s.paused() {
				return 0, errPaused
			}
			if s.act.expired(src, true) {
				return 0, errIdle
			}
			continue
		case err != nil:
			return 0, err
		case serr == unix.EINTR:
			continue
		case serr != nil:
			return 0, os.NewSyscallError("splice", serr)
		}
		return int(n), nil
	}
}

// drain moves the n bytes in p to dst. A dst that takes none of them for
// StallTimeout ends the transfer, so that a peer that never reads cannot
// keep the bytes (a pipe of them, and the sockets' buffers) for the
// connection's whole idle timeout, as after the client that sent them
// left: its end of stream waits behind the bytes the proxy has not read,
// so the proxy cannot see it.
func (s splicer) drain(dst side, p *pipe, n int) error {
	stalled, armed := time.Now(), false
	for n > 0 {
		var m int64
		var serr error
		err := dst.rc.Write(func(fd uintptr) bool {
			m, serr = unix.Splice(p.r, nil, int(fd), nil, n, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
			// The first time dst is full, come back to set the
			// deadline of the check before waiting.
			return serr != unix.EAGAIN || (s.stall > 0 && !armed)
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			if s.act.expired(dst, false) {
				return errIdle
			}
			if s.stall > 0 {
				if time.Since(stalled) >= s.stall {
					return errStalled
				}
				s.check(dst, stalled)
			}
			continue
		case err != nil:
			return err
		case serr == unix.EAGAIN:
			armed = true
			s.check(dst, stalled)
			continue
		case serr == unix.EINTR:
			continue
		case serr != nil:
			return os.NewSyscallError("splice", serr)
		}
		if m > 0 {
			n -= int(m)
			stalled = time.Now()
		}
	}
	if armed {
		s.act.expired(dst, false) // back to the activity's deadline
	}
	return nil
}

// check sets dst's write deadline to the end of the stall that began at
// stalled, or the activity's deadline when it comes first.
func (s splicer) check(dst side, stalled time.Time) {
	next := stalled.Add(s.stall)
	if idle := s.act.timeout(); idle > 0 {
		if d := time.Unix(0, s.act.last.Load()).Add(idle); d.Before(next) {
			next = d
		}
	}
	_ = dst.f.SetWriteDeadline(next)
}

// shutdownWrite ends the writing side of a socket: its peer reads the end
// of the stream.
func shutdownWrite(s side) error {
	var serr error
	err := s.rc.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) })
	if err == nil && serr != nil && serr != unix.ENOTCONN {
		err = os.NewSyscallError("shutdown", serr)
	}
	return err
}

// Buffers of near peers. The kernel grows a TCP socket's buffers with
// its connection's throughput (autotuning), up to net.ipv4.tcp_rmem's and
// tcp_wmem's maximum, several MiB: on a fast path that many bytes then
// wait in the proxy's sockets between the client's write and the
// endpoint's read, long enough to leave the processor's caches, and the
// endpoint's read of them costs about twice as much. A socket whose peer
// is near (a round trip under nearRTT: the node itself, its pods, the
// hosts of its network) has its buffers capped at nearBuffer (the kernel
// doubles it for its bookkeeping), which still covers the bandwidth-delay
// product of such a path (512 KiB per 200 µs: 2.6 GB/s); a socket whose
// peer is farther keeps the autotuning, which its window needs.
const (
	nearRTT    = 200 * time.Microsecond
	nearBuffer = 512 << 10
)

// bufferNear caps the buffers of a connected TCP socket whose peer is
// near, by the round trip the kernel measured during the handshake.
func bufferNear(s side) {
	_ = s.rc.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return
		}
		if size := bufferFor(time.Duration(info.Rtt) * time.Microsecond); size > 0 {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, size)
		}
	})
}

// bufferFor returns the buffer size for a peer at round trip rtt: 0 for
// the kernel's autotuning (a far peer, or one the kernel has not
// measured).
func bufferFor(rtt time.Duration) int {
	if rtt <= 0 || rtt >= nearRTT {
		return 0
	}
	return nearBuffer
}
