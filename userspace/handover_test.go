//go:build linux

package userspace

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The load a restart is measured under.
const (
	restartHeld = 300
	restartRate = 50
)

// TestHandOver: a new proxier takes the listening sockets and the TCP
// connections of an old one over (a restart, an upgrade): of restartHeld
// connections held through the old one, none is cut, each echoes on
// through the new one, and of the new connections made at restartRate a
// second meanwhile, none fails. A restart without it cuts them all.
func TestHandOver(t *testing.T) {
	for _, handover := range []bool{true, false} {
		name := map[bool]string{true: "handover", false: "restart"}[handover]
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, 2)
			st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(1)))
			old := newProxier(t, w, Options{})
			mustSync(t, old, st)
			at := w.at(key(1, "tcp")).String()
			held := make([]heldConn, 0, restartHeld)
			for range restartHeld {
				c, err := net.DialTimeout("tcp", at, 2*time.Second)
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = rw.ReadString('\n') // the endpoint's greeting
				require.NoError(t, err)
				held = append(held, heldConn{c, rw})
			}
			var opened, failed, slowest atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				tick := time.NewTicker(time.Second / restartRate)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					opened.Add(1)
					wg.Go(func() {
						start := time.Now()
						if _, err := tryTCP(w.at(key(1, "tcp"))); err != nil {
							failed.Add(1)
						}
						took := int64(time.Since(start))
						for cur := slowest.Load(); took > cur && !slowest.CompareAndSwap(cur, took); cur = slowest.Load() {
						}
					})
				}
			})
			var streams []*stream
			if handover {
				for range 4 {
					streams = append(streams, startStream(t, at))
				}
			}
			time.Sleep(200 * time.Millisecond)
			var fresh *Proxier
			if handover {
				a, b := seqpacketPair(t)
				done := handOverAsync(t, old, a)
				fresh = newProxier(t, w, Options{TakeOver: b})
				mustSync(t, fresh, st)
				require.NoError(t, <-done)
			} else {
				old.Close()
				fresh = newProxier(t, w, Options{})
				mustSync(t, fresh, st)
			}
			old.Close()
			time.Sleep(500 * time.Millisecond)
			close(stop)
			wg.Wait()
			for i, s := range streams {
				sent, got, err := s.stop()
				assert.NoError(t, err, "stream %d", i)
				assert.Equal(t, sent, got, "stream %d: bytes sent and echoed back across the handover", i)
				t.Logf("stream %d: %d bytes each way across the handover", i, got)
			}
			cut := 0
			for _, h := range held {
				if h.echo() != nil {
					cut++
				}
			}
			t.Logf("%s: %d of %d held connections cut, %d of %d new connections failed, the slowest in %v",
				name, cut, restartHeld, failed.Load(), opened.Load(), time.Duration(slowest.Load()).Round(time.Millisecond))
			if handover {
				assert.Zero(t, cut, "held connections cut")
				assert.Zero(t, failed.Load(), "new connections failed")
				assert.GreaterOrEqual(t, stats(t, fresh, key(1, "tcp")).TakenOver, uint64(restartHeld+len(streams)),
					"the held connections and the streams, and the new connections open then")
			} else {
				assert.Equal(t, restartHeld, cut, "a restart without a handover cuts every connection")
			}
		})
	}
}

// TestHandOverAConnectionBeingMade: a connection the old proxier has
// accepted and is still making to its endpoint when the handover starts
// is handed over once it is made, rather than kept by the old proxier and
// cut when it closes. The endpoint's accept queue is full, so it drops
// the proxy's SYN and takes its retransmission a second later.
func TestHandOverAConnectionBeingMade(t *testing.T) {
	w := newWorld(t, 0)
	slow := startSlowTCP(t, "slow")
	w.real[netip.AddrPortFrom(epAddr(0), tcpTarget)] = slow.at
	st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
	// Time enough for a busy machine: the kernel sends the SYN again 1,
	// 3, 7 and 15 s after the first.
	old := newProxier(t, w, Options{ConnectTimeout: 30 * time.Second})
	mustSync(t, old, st)
	c, err := net.DialTimeout("tcp", w.at(key(1, "tcp")).String(), 2*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.Eventually(t, func() bool { return synSent(t, slow.at) }, 10*time.Second, 10*time.Millisecond,
		"the proxy connects to the endpoint")

	a, b := seqpacketPair(t)
	handed := handOverAsync(t, old, a)
	synced := make(chan struct{})
	fresh := newProxier(t, w, Options{TakeOver: b})
	go func() {
		defer close(synced)
		mustSync(t, fresh, st)
	}()
	// The queue has room once the handover is under way; the proxy's
	// SYN is taken when it is sent again.
	time.Sleep(300 * time.Millisecond)
	slow.release()
	require.NoError(t, <-handed)
	old.Close()
	<-synced

	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	greeting, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "the connection being made at the handover was cut")
	assert.Equal(t, "slow\n", greeting)
	assert.Equal(t, uint64(1), stats(t, fresh, key(1, "tcp")).TakenOver)
}

// TestHandOverPacesItsConnections: HandOver sends a new process that
// acknowledges connections at most handoverWindow ahead of its
// acknowledgements, so that a slow new process holds few connections
// still at a time; a process that does not say it acknowledges (v0.1.0)
// is sent every connection at once.
func TestHandOverPacesItsConnections(t *testing.T) {
	const conns = 3 * handoverWindow
	for _, acks := range []bool{true, false} {
		t.Run(map[bool]string{true: "acknowledging", false: "v0.1.0"}[acks], func(t *testing.T) {
			w := newWorld(t, 1)
			st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
			old := newProxier(t, w, Options{})
			mustSync(t, old, st)
			for range conns {
				c, err := net.DialTimeout("tcp", w.at(key(1, "tcp")).String(), 2*time.Second)
				require.NoError(t, err)
				t.Cleanup(func() { c.Close() })
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, err = bufio.NewReader(c).ReadString('\n') // the greeting
				require.NoError(t, err)
			}
			a, b := seqpacketPair(t)
			handed := handOverAsync(t, old, a)
			// The new process, played by the test.
			require.NoError(t, sendHandover(b, handoverMsg{Op: opHello, Acks: acks}))
			for {
				m, fds, err := recvHandover(b)
				require.NoError(t, err)
				closeFDs(fds)
				if m.Op == opListeners {
					break
				}
			}
			require.NoError(t, sendHandover(b, handoverMsg{Op: opReady}))
			got := make(chan string, conns+1)
			go func() {
				for {
					m, fds, err := recvHandover(b)
					closeFDs(fds)
					if err != nil {
						return
					}
					got <- m.Op
					if m.Op == opDone {
						return
					}
				}
			}()
			// Before any acknowledgement: a window's worth, or all.
			want := conns
			if acks {
				want = handoverWindow
			}
			for range want {
				select {
				case op := <-got:
					require.Equal(t, opConn, op)
				case <-time.After(5 * time.Second):
					t.Fatal("HandOver sent too few connections")
				}
			}
			if acks {
				select {
				case op := <-got:
					t.Fatalf("HandOver sent %q beyond its window", op)
				case <-time.After(300 * time.Millisecond):
				}
				// Each acknowledgement lets one more go.
				for range conns - handoverWindow {
					require.NoError(t, sendHandover(b, handoverMsg{Op: opTook}))
					require.Equal(t, opConn, <-got)
				}
				for range handoverWindow {
					require.NoError(t, sendHandover(b, handoverMsg{Op: opTook}))
				}
			}
			select {
			case op := <-got:
				require.Equal(t, opDone, op)
			case <-time.After(5 * time.Second):
				t.Fatal("HandOver did not finish")
			}
			require.NoError(t, <-handed)
		})
	}
}

// slowTCP is an endpoint whose accept queue is full until release: it
// drops every SYN meanwhile. Then it greets each connection with its
// name.
type slowTCP struct {
	at      netip.AddrPort
	release func()
}

func startSlowTCP(t *testing.T, name string) *slowTCP {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, unix.Listen(fd, 0)) // full with one connection queued
	f := os.NewFile(uintptr(fd), "slow")
	ln, err := net.FileListener(f)
	f.Close()
	require.NoError(t, err)
	at := ln.Addr().(*net.TCPAddr).AddrPort()
	filler, err := net.DialTimeout("tcp", at.String(), 2*time.Second)
	require.NoError(t, err)
	released := make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-released
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			_, _ = io.WriteString(c, name+"\n")
		}
	}()
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(func() {
		ln.Close()
		filler.Close()
		release() // else a test that failed before releasing waits here
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return &slowTCP{at: at, release: release}
}

// synSent reports whether a socket of this network namespace is
// connecting to at (SYN-SENT in /proc/net/tcp).
func synSent(t *testing.T, at netip.AddrPort) bool {
	t.Helper()
	// The calling thread's namespace, not the process's: /proc/net is
	// the main thread's, which a goroutine that ended locked in another
	// namespace (a test's) leaves there for good.
	runtime.LockOSThread()
	b, err := os.ReadFile("/proc/thread-self/net/tcp")
	runtime.UnlockOSThread()
	require.NoError(t, err)
	a4 := at.Addr().As4()
	remote := fmt.Sprintf("%02X%02X%02X%02X:%04X", a4[3], a4[2], a4[1], a4[0], at.Port())
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] == remote && f[3] == "02" {
			return true
		}
	}
	return false
}

// heldConn is a connection held through the proxy, greeted.
type heldConn struct {
	c  net.Conn
	rw *bufio.ReadWriter
}

// echo sends a line on a held connection and reads it back.
func (h heldConn) echo() error {
	rw := h.rw
	_ = h.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := rw.WriteString("ping\n"); err != nil {
		return err
	}
	if err := rw.Flush(); err != nil {
		return err
	}
	line, err := rw.ReadString('\n')
	if err == nil && line != "ping\n" {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// handOverAsync runs old's HandOver over a in the background, as an old
// process does, and returns its outcome once it ends.
func handOverAsync(t *testing.T, old *Proxier, a *net.UnixConn) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		h, err := old.HandOver(ctx, a)
		t.Logf("handed over in %v: %+v", time.Since(start).Round(time.Millisecond), h)
		done <- err
	}()
	return done
}

// seqpacketPair returns the two ends of a Unix SOCK_SEQPACKET pair.
func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	var out [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "handover")
		c, err := net.FileConn(f)
		f.Close()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		out[i] = c.(*net.UnixConn)
	}
	return out[0], out[1]
}

// stream writes a known sequence of bytes through a connection to the
// echo server and reads it back, checking each byte, until stop.
type stream struct {
	c          net.Conn
	sent, got  atomic.Int64
	stopped    atomic.Bool
	readerDone chan error
	writerDone chan struct{}
}

func patternByte(i int64) byte { return byte(i % 251) }

func startStream(t *testing.T, at string) *stream {
	t.Helper()
	c, err := net.DialTimeout("tcp", at, 2*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	_, err = r.ReadString('\n') // the greeting
	require.NoError(t, err)
	s := &stream{c: c, readerDone: make(chan error, 1), writerDone: make(chan struct{})}
	go func() {
		defer close(s.writerDone)
		buf := make([]byte, 16<<10)
		for !s.stopped.Load() {
			n := s.sent.Load()
			for i := range buf {
				buf[i] = patternByte(n + int64(i))
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
			s.sent.Add(int64(len(buf)))
		}
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			for i := range n {
				if buf[i] != patternByte(s.got.Load()+int64(i)) {
					s.readerDone <- io.ErrUnexpectedEOF
					return
				}
			}
			s.got.Add(int64(n))
			if err != nil {
				s.readerDone <- nil
				return
			}
		}
	}()
	return s
}

// stop ends the writing, waits for the echo of every byte written while
// the echo makes progress (megabytes may be on the way, in the sockets'
// buffers), and returns the counts.
func (s *stream) stop() (sent, got int64, err error) {
	s.stopped.Store(true)
	<-s.writerDone
	last, moved := s.got.Load(), time.Now()
	for s.got.Load() < s.sent.Load() && time.Since(moved) < 3*time.Second {
		select {
		case err := <-s.readerDone:
			return s.sent.Load(), s.got.Load(), err
		case <-time.After(10 * time.Millisecond):
		}
		if g := s.got.Load(); g != last {
			last, moved = g, time.Now()
		}
	}
	return s.sent.Load(), s.got.Load(), nil
}

// TestTakeOverFromALyingPeer: a new proxier checks what an older process
// hands it instead of taking its word: a listener that is not a socket,
// is of another protocol, does not listen, is bound elsewhere, or comes
// in a message it cannot read, ends the handover, and the proxier serves
// afresh; a connection that is not a connected TCP socket is passed over.
func TestTakeOverFromALyingPeer(t *testing.T) {
	socket := func(t *testing.T, typ int, at netip.AddrPort, listen bool) int {
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		require.NoError(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1))
		require.NoError(t, unix.Bind(fd, sockaddr.From(at)))
		if listen {
			require.NoError(t, unix.Listen(fd, 1))
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	pipe := func(t *testing.T) int {
		var p [2]int
		require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
		t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
		return p[0]
	}
	for _, c := range []struct {
		name string
		// lie sends the lie about the listener at, after the hello.
		lie func(t *testing.T, c *net.UnixConn, at netip.AddrPort)
	}{
		{"not-a-socket", func(t *testing.T, c *net.UnixConn, at netip.AddrPort) {
			require.NoError(t, sendHandover(c, handoverMsg{Op: opListener, Proto: servicelb.TCP, At: at}, pipe(t)))
		}},
		{"another-protocol", func(t *testing.T, c *net.UnixConn, at netip.AddrPort) {
			fd := socket(t, unix.SOCK_DGRAM, at, false)
			require.NoError(t, sendHandover(c, handoverMsg{Op: opListener, Proto: servicelb.TCP, At: at}, fd))
		}},
		{"not-listening", func(t *testing.T, c *net.UnixConn, at netip.AddrPort) {
			fd := socket(t, unix.SOCK_STREAM, at, false)
			require.NoError(t, sendHandover(c, handoverMsg{Op: opListener, Proto: servicelb.TCP, At: at}, fd))
		}},
		{"bound-elsewhere", func(t *testing.T, c *net.UnixConn, at netip.AddrPort) {
			fd := socket(t, unix.SOCK_STREAM, freePort(t), true)
			require.NoError(t, sendHandover(c, handoverMsg{Op: opListener, Proto: servicelb.TCP, At: at}, fd))
		}},
		{"unreadable", func(t *testing.T, c *net.UnixConn, _ netip.AddrPort) {
			_, err := c.Write([]byte("{\"op\": \"listener\", \"at\": "))
			require.NoError(t, err)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, 1)
			at := freePort(t)
			w.listen[key(1, "tcp")] = at
			st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
			a, b := seqpacketPair(t)
			peer := make(chan error, 1)
			go func() {
				m, _, err := recvHandover(a)
				if err == nil {
					err = unexpected(m.Op, opHello)
				}
				if err != nil {
					peer <- err
					return
				}
				c.lie(t, a, at)
				_ = sendHandover(a, handoverMsg{Op: opListeners})
				// A proxier that took the lie says ready after its
				// first sync, and is told there is nothing more.
				if m, _, err := recvHandover(a); err == nil && m.Op == opReady {
					_ = sendHandover(a, handoverMsg{Op: opDone})
				}
				peer <- nil
			}()
			fresh := newProxier(t, w, Options{TakeOver: b})
			mustSync(t, fresh, st)
			require.NoError(t, <-peer)
			got, err := tryTCP(at)
			require.NoError(t, err, "the proxier took the lie: nothing serves %s", at)
			assert.Equal(t, "ep-0", got)
		})
	}
	t.Run("connection", func(t *testing.T) {
		w := newWorld(t, 1)
		st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
		a, b := seqpacketPair(t)
		go func() {
			if _, _, err := recvHandover(a); err != nil {
				return
			}
			_ = sendHandover(a, handoverMsg{Op: opListeners})
			if _, _, err := recvHandover(a); err != nil {
				return
			}
			_ = sendHandover(a, handoverMsg{Op: opConn, Port: key(1, "tcp")}, pipe(t), pipe(t))
			_ = sendHandover(a, handoverMsg{Op: opDone})
		}()
		fresh := newProxier(t, w, Options{TakeOver: b})
		mustSync(t, fresh, st)
		assert.Zero(t, stats(t, fresh, key(1, "tcp")).TakenOver, "a pipe taken over as a connection")
		got, err := tryTCP(w.at(key(1, "tcp")))
		require.NoError(t, err)
		assert.Equal(t, "ep-0", got)
	})
}
