//go:build linux

package userspace

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTCPForwards: a connection to a listener reaches an endpoint, whose
// bytes come back unchanged, and is counted.
func TestTCPForwards(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "tcp"))
	c, err := net.Dial("tcp", at.String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(line, "ep-0 127.0.0.1:"), "the endpoint sees the proxy: %q", line)
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	got := make([]byte, 5)
	_, err = io.ReadFull(r, got)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	// The byte counters move once bytes have been sent on, which may be
	// after they arrived.
	want := PortStats{Key: key(1, "tcp"), Protocol: servicelb.TCP, Active: 1, Accepted: 1, BytesIn: 5, BytesOut: uint64(len(line) + 5)}
	assert.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, stats(t, p, key(1, "tcp"))) },
		5*time.Second, 10*time.Millisecond)
}

// TestSpread: new connections spread over the endpoints in proportion to
// their weights (weighted random by default), drained ones take none.
func TestSpread(t *testing.T) {
	w := newWorld(t, 4)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{},
		service(1, weighted(1, ep(0)), weighted(2, ep(1)), weighted(3, ep(2)), weighted(0, ep(3)))))
	const n = 600
	counts := count(t, w.at(key(1, "tcp")), n)
	assert.Zero(t, counts["ep-3"], "a drained endpoint took new connections")
	require.NoError(t, netnstest.WithinBounds(counts, netnstest.WeightedShares(map[string]float64{"ep-0": 1, "ep-1": 2, "ep-2": 3}), n))
}

// TestRoundRobin: "wrr" gives each endpoint exactly its weight of every
// cycle of new connections, interleaved; "rr" ignores the weights.
func TestRoundRobin(t *testing.T) {
	w := newWorld(t, 3)
	p := newProxier(t, w, Options{})
	for _, tc := range []struct {
		sch  servicelb.Scheduler
		want map[string]int
	}{
		{servicelb.SchedulerWeightedRR, map[string]int{"ep-0": 10, "ep-1": 20, "ep-2": 30}},
		{servicelb.SchedulerRoundRobin, map[string]int{"ep-0": 20, "ep-1": 20, "ep-2": 20}},
	} {
		t.Run(string(tc.sch), func(t *testing.T) {
			s := service(1, weighted(1, ep(0)), weighted(2, ep(1)), weighted(3, ep(2)))
			s.Scheduler = tc.sch
			mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
			assert.Equal(t, tc.want, count(t, w.at(key(1, "tcp")), 60))
		})
	}
}

// TestDialRetry: an endpoint that refuses is passed over for another, the
// failures counted and reported; a connection none accepts is reset.
func TestDialRetry(t *testing.T) {
	w := newWorld(t, 1)
	var mu sync.Mutex
	var failed []netip.AddrPort
	hooks := Hooks{DialError: func(k servicelb.ServicePortKey, to netip.AddrPort, err error) {
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, key(1, "tcp"), k)
		assert.ErrorIs(t, err, syscall.ECONNREFUSED)
		failed = append(failed, to)
	}}
	p := newProxier(t, w, Options{Hooks: hooks, DialAttempts: 6})
	// Hosts 5 to 9 have no stand-in: they refuse.
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(5), ep(6), ep(7), ep(8), ep(9))))
	for range 20 {
		assert.Equal(t, "ep-0", askTCP(t, w.at(key(1, "tcp"))))
	}
	mu.Lock()
	n := len(failed)
	mu.Unlock()
	assert.NotZero(t, n)
	assert.Equal(t, uint64(n), stats(t, p, key(1, "tcp")).DialErrors)

	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(5), ep(6))))
	_, err := tryTCP(w.at(key(1, "tcp")))
	require.Error(t, err)
	assert.Equal(t, uint64(1), stats(t, p, key(1, "tcp")).Refused)
}

// TestHalfClose: a client that ends its side still reads the endpoint's
// answer, and sees the endpoint's end after it.
func TestHalfClose(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	all, err := io.ReadAll(c) // the server echoes until our end, then ends its own
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(all), "\nlast words"), "%q", all)
}

// TestStream: a large stream crosses the proxy byte for byte, both ways
// at once (1 GiB each way; 64 MiB with -short).
func TestStream(t *testing.T) {
	size := int64(1 << 30)
	if testing.Short() {
		size = 64 << 20
	}
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReaderSize(c, 1<<16)
	_, err = r.ReadString('\n')
	require.NoError(t, err)
	sent, got := sha256.New(), sha256.New()
	done := make(chan error, 1)
	go func() {
		src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{1}), size), sent)
		_, err := io.Copy(c, src)
		done <- errors.Join(err, c.(*net.TCPConn).CloseWrite())
	}()
	n, err := io.Copy(got, r)
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Equal(t, size, n)
	assert.Equal(t, sent.Sum(nil), got.Sum(nil), "the bytes changed on the way")
	require.Eventually(t, func() bool { return stats(t, p, key(1, "tcp")).BytesIn == uint64(size) }, 5*time.Second, 10*time.Millisecond)
}

// TestIdleTimeout: a connection that moves nothing either way for the
// idle timeout is closed; one that keeps moving is not.
func TestIdleTimeout(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{IdleTimeout: 300 * time.Millisecond})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	busy, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer busy.Close()
	idle, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer idle.Close()
	br, ir := bufio.NewReader(busy), bufio.NewReader(idle)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	_, err = ir.ReadString('\n')
	require.NoError(t, err)
	start := time.Now()
	for time.Since(start) < time.Second {
		_, err := busy.Write([]byte("x"))
		require.NoError(t, err)
		_, err = br.ReadByte()
		require.NoError(t, err, "a busy connection was closed")
		time.Sleep(50 * time.Millisecond)
	}
	idle.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = ir.ReadByte()
	require.Error(t, err)
	assert.False(t, errors.Is(err, syscall.ETIMEDOUT) || isTimeout(err), "the idle connection was not closed: %v", err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestNoEndpointsRefused: a port without endpoints has no listener: a
// connection is refused at once.
func TestNoEndpointsRefused(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "tcp"))
	assert.Equal(t, "ep-0", askTCP(t, at))
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1)))
	_, err := net.DialTimeout("tcp", at.String(), time.Second)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	assert.Equal(t, "ep-0", askTCP(t, at))
}

// TestDropResets: a flow the verdict drops (the internal Local policy on
// a node without a local endpoint) is reset, and counted.
func TestDropResets(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	s := service(1, ep(0))
	s.InternalTrafficPolicy = servicelb.PolicyLocal
	mustSync(t, p, mustState(t, servicelb.NodeConfig{NodeName: "here"}, s))
	_, err := tryTCP(w.at(key(1, "tcp")))
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF), "%v", err)
	assert.Equal(t, uint64(1), stats(t, p, key(1, "tcp")).Refused)
	assert.Zero(t, stats(t, p, key(1, "tcp")).Accepted)
}

// TestAffinity: a client sticks to the endpoint it first reached while
// it comes back within the timeout; after it, it draws anew; a pin to an
// endpoint that left the set is not followed.
func TestAffinity(t *testing.T) {
	w := newWorld(t, 3)
	p := newProxier(t, w, Options{})
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	p.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := service(1, ep(0), ep(1), ep(2))
	s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: 10 * time.Second}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	at := w.at(key(1, "tcp"))
	first := askTCP(t, at)
	for range 20 {
		advance(9 * time.Second)
		require.Equal(t, first, askTCP(t, at), "the pin did not hold")
	}
	seen := map[string]bool{}
	for range 30 {
		advance(10 * time.Second)
		seen[askTCP(t, at)] = true
	}
	assert.Len(t, seen, 3, "after the timeout the client draws anew each time")

	pinned := askTCP(t, at)
	var keep []servicelb.Endpoint
	for i := range 3 {
		if pinned != "ep-"+string(rune('0'+i)) {
			keep = append(keep, ep(i))
		}
	}
	s.Endpoints = keep
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	assert.NotEqual(t, pinned, askTCP(t, at), "a pin to a removed endpoint was followed")
}

// TestAffinityAcrossDialFailure: a pin to an endpoint that stopped
// answering is dropped: the client is pinned to the one that took it.
func TestAffinityAcrossDialFailure(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{})
	s := service(1, ep(0), ep(1))
	s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Hour}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	at := w.at(key(1, "tcp"))
	first := askTCP(t, at)
	w.mu.Lock()
	gone := netip.AddrPortFrom(epAddr(0), tcpTarget)
	if first == "ep-1" {
		gone = netip.AddrPortFrom(epAddr(1), tcpTarget)
	}
	delete(w.real, gone)
	w.mu.Unlock()
	other := askTCP(t, at)
	assert.NotEqual(t, first, other)
	w.mu.Lock()
	w.real[gone] = w.tcp[map[string]int{"ep-0": 0, "ep-1": 1}[first]].at
	w.mu.Unlock()
	assert.Equal(t, other, askTCP(t, at), "the pin did not move to the endpoint that answered")
}

// TestDrain: removing an endpoint sends no new connection to it while
// the ones it has go on; with a drain timeout they end after it.
func TestDrain(t *testing.T) {
	for _, timeout := range []time.Duration{0, 200 * time.Millisecond} {
		t.Run(timeout.String(), func(t *testing.T) {
			w := newWorld(t, 2)
			p := newProxier(t, w, Options{DrainTimeout: timeout})
			mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
			at := w.at(key(1, "tcp"))
			c, err := net.Dial("tcp", at.String())
			require.NoError(t, err)
			defer c.Close()
			r := bufio.NewReader(c)
			_, err = r.ReadString('\n')
			require.NoError(t, err)

			mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(1))))
			assert.Equal(t, map[string]int{"ep-1": 10}, count(t, at, 10))
			time.Sleep(2 * timeout)
			_, err = c.Write([]byte("ping"))
			if timeout == 0 {
				require.NoError(t, err)
				buf := make([]byte, 4)
				_, err = io.ReadFull(r, buf)
				require.NoError(t, err, "the connection to the removed endpoint did not go on")
				assert.Zero(t, stats(t, p, key(1, "tcp")).Drained)
				return
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = r.ReadByte()
			require.Error(t, err, "the connection outlived the drain timeout")
			assert.False(t, isTimeout(err), "%v", err)
			assert.Equal(t, uint64(1), stats(t, p, key(1, "tcp")).Drained)
		})
	}
}

// TestDrainedEndpointKeepsConnections: an endpoint drained to weight 0
// still serves: its connections are not cut, even with a drain timeout.
func TestDrainedEndpointKeepsConnections(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{DrainTimeout: 100 * time.Millisecond})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	_, err = r.ReadString('\n')
	require.NoError(t, err)
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, weighted(0, ep(0)), ep(1))))
	time.Sleep(300 * time.Millisecond)
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(r, buf)
	require.NoError(t, err)
	assert.Equal(t, []byte("ping"), buf)
}

// TestConnectionsOutliveTheirPort: a service removed closes its listener;
// its connections go on (DrainTimeout zero).
func TestConnectionsOutliveTheirPort(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(0))))
	at := w.at(key(1, "tcp"))
	c, err := net.Dial("tcp", at.String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	_, err = r.ReadString('\n')
	require.NoError(t, err)
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(2, ep(0))))
	_, err = net.DialTimeout("tcp", at.String(), time.Second)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the listener of a removed service")
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(r, buf)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(buf, []byte("ping")))
}

// TestIdleConnectionsReleased: many idle connections through the proxy
// cost it memory while they are open (its goroutines, stacks and
// connection state), and once they have all closed its Go heap and
// goroutine stacks, and its goroutines, are back where they were.
func TestIdleConnectionsReleased(t *testing.T) {
	n := fileLimitFor(t, 2000)
	_, proxied, p := benchSetup(t)
	before := runtime.NumGoroutine()
	// A first round grows the runtime's caches (the descriptors of
	// goroutines that ended, which it keeps for new ones) to this load.
	openIdle(t, proxied, n)()
	waitIdle(t, p)
	waitGoroutines(t, before)
	base := goMemory()
	closeAll := openIdle(t, proxied, n)
	open := goMemory()
	require.Equal(t, int64(n), p.activeConns())
	closeAll()
	waitIdle(t, p)
	waitGoroutines(t, before)
	// Closed sockets' files are freed by their cleanups, which a
	// goroutine of the runtime runs after a collection: on a busy machine
	// that goroutine may wait for a processor for seconds. Measure again
	// while that may still be the case; what a leak holds never goes.
	bound := int64(n) * 256
	after := goMemory()
	for deadline := time.Now().Add(15 * time.Second); after-base >= bound && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		after = goMemory()
	}
	t.Logf("%d connections: %.1f KiB each while open, %+d bytes in all after", n, float64(open-base)/float64(n)/1024, after-base)
	assert.Greater(t, open-base, int64(n)*1024, "the connections cost less than 1 KiB each: the measure does not see them")
	assert.Less(t, after-base, bound, "more than 256 bytes per connection kept after they closed")
}

// TestNearPeerBuffers: both sockets of a connection whose peers are near
// (here on loopback) have their kernel buffers capped, and keep them for
// the connection's life; a far or unmeasured peer keeps the autotuning.
func TestNearPeerBuffers(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer c.Close()
	// The endpoint's greeting has come through: the proxy is copying.
	_, err = bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	p.connMu.Lock()
	var pc *conn
	for x := range p.conns {
		pc = x
	}
	p.connMu.Unlock()
	require.NotNil(t, pc)
	for name, s := range map[string]side{"client": pc.client, "backend": pc.backend} {
		for _, opt := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF} {
			var v int
			var gerr error
			require.NoError(t, s.rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt) }))
			require.NoError(t, gerr)
			assert.Equal(t, 2*nearBuffer, v, "%s socket, option %d (the kernel doubles what it is given)", name, opt)
		}
	}
	assert.Equal(t, nearBuffer, bufferFor(30*time.Microsecond))
	assert.Zero(t, bufferFor(0), "not measured")
	assert.Zero(t, bufferFor(nearRTT))
	assert.Zero(t, bufferFor(20*time.Millisecond))
}

// TestStalledTransferEnds: clients that write more than an endpoint that
// never reads will take, and then leave, keep nothing in the proxy once
// StallTimeout passes without the endpoint taking a byte: their
// connections end, and with them the pipes and sockets of their bytes.
func TestStalledTransferEnds(t *testing.T) {
	w := newWorld(t, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var held []net.Conn // accepted, never read
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	w.real[netip.AddrPortFrom(epAddr(0), tcpTarget)] = netip.MustParseAddrPort(ln.Addr().String())
	p := newProxier(t, w, Options{StallTimeout: 2 * time.Second})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	before := pipeFDs(t)
	const clients = 20
	payload := make([]byte, 4<<20)
	var wg sync.WaitGroup
	for range clients {
		c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
		require.NoError(t, err)
		wg.Go(func() {
			defer c.Close()
			_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
			_, _ = c.Write(payload) // stops when every buffer on the way is full
		})
	}
	wg.Wait()
	require.Equal(t, int64(clients), p.activeConns(), "the connections ended before their clients left")
	heldPipes, heldRSS := pipeFDs(t)-before, rss(t)
	assert.Eventually(t, func() bool { return p.activeConns() == 0 }, 10*time.Second, 50*time.Millisecond,
		"connections whose clients left, stalled on an endpoint that never reads, were kept")
	t.Logf("%d clients gone: %d pipe descriptors and %d MiB resident while stalled, %d and %d MiB after",
		clients, heldPipes, heldRSS>>20, pipeFDs(t)-before, rss(t)>>20)
	assert.LessOrEqual(t, pipeFDs(t)-before, 2*spare, "pipes beyond the pool's spares kept")
}

// rss returns the process's resident memory, in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// pipeFDs counts the process's pipe descriptors.
func pipeFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && strings.HasPrefix(l, "pipe:") {
			n++
		}
	}
	return n
}
