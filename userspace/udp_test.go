//go:build linux

package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func udpClient(t *testing.T) *net.UDPConn {
	t.Helper()
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	return pc
}

// TestUDPSession: a client's datagrams reach one endpoint, and its
// replies come from the address the client sent to; each client is a
// session of its own, counted while it lasts.
func TestUDPSession(t *testing.T) {
	w := newWorld(t, 3)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(1), ep(2))))
	at := w.at(key(1, "udp"))
	c := udpClient(t)
	first, from := sendUDP(t, c, at, "one")
	assert.Equal(t, at, from, "the reply came from another address")
	for range 10 {
		name, _ := sendUDP(t, c, at, "more")
		assert.Equal(t, first, name, "a session's datagrams went to another endpoint")
	}
	seen := map[string]bool{}
	for range 30 {
		// Each client keeps its port to the end: a closed one's port
		// may come again, as the same session.
		name, _ := sendUDP(t, udpClient(t), at, "hello")
		seen[name] = true
	}
	assert.Len(t, seen, 3, "new clients spread")
	// The counters move once a datagram is sent on, which may be after
	// its answer is back.
	want := PortStats{Key: key(1, "udp"), Protocol: servicelb.UDP, Active: 31, Accepted: 31,
		BytesIn: uint64(len("one") + 10*len("more") + 30*len("hello"))}
	want.BytesOut = want.BytesIn + 31*uint64(len("ep-0 ")) + 10*uint64(len("ep-0 "))
	assert.EventuallyWithT(t, func(c *assert.CollectT) { assert.Equal(c, want, stats(t, p, key(1, "udp"))) },
		5*time.Second, 10*time.Millisecond)
}

// TestUDPSessionsWaitWithoutGoroutines: 500 UDP sessions, each answered,
// cost no goroutine while they wait for their endpoints' replies: one
// goroutine waits for all of them.
func TestUDPSessionsWaitWithoutGoroutines(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(1))))
	at := w.at(key(1, "udp"))
	sendUDP(t, udpClient(t), at, "first")
	before := runtime.NumGoroutine()
	const sessions = 500
	for range sessions {
		sendUDP(t, udpClient(t), at, "hello")
	}
	assert.Equal(t, int64(sessions+1), stats(t, p, key(1, "udp")).Active)
	t.Logf("%d sessions more, %d goroutines more", sessions, runtime.NumGoroutine()-before)
	assert.Less(t, runtime.NumGoroutine(), before+sessions/10, "goroutines grow with the sessions")
}

// TestUDPIdleTimeout: a session ends after the idle timeout; the
// client's next datagram starts a new one.
func TestUDPIdleTimeout(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{UDPIdleTimeout: 200 * time.Millisecond})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "udp"))
	c := udpClient(t)
	sendUDP(t, c, at, "one")
	for range 6 { // kept alive past the timeout by its datagrams
		time.Sleep(100 * time.Millisecond)
		sendUDP(t, c, at, "again")
	}
	assert.Equal(t, uint64(1), stats(t, p, key(1, "udp")).Accepted)
	require.Eventually(t, func() bool { return stats(t, p, key(1, "udp")).Active == 0 }, 3*time.Second, 20*time.Millisecond)
	sendUDP(t, c, at, "back")
	assert.Equal(t, uint64(2), stats(t, p, key(1, "udp")).Accepted)
}

// TestUDPStreamTimeout: a session that has had a reply and still carries
// datagrams 2 s after it began is a stream, as conntrack's assured flow:
// it idles for UDPStreamTimeout, where a session of one datagram and its
// answer idles for UDPIdleTimeout.
func TestUDPStreamTimeout(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{UDPIdleTimeout: 500 * time.Millisecond, UDPStreamTimeout: 10 * time.Second})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "udp"))
	stream, brief := udpClient(t), udpClient(t)
	sendUDP(t, stream, at, "one")
	sendUDP(t, brief, at, "one")
	start := time.Now()
	for time.Since(start) < streamAfter+300*time.Millisecond { // alive past streamAfter
		time.Sleep(150 * time.Millisecond)
		sendUDP(t, stream, at, "again")
	}
	assert.Equal(t, int64(1), stats(t, p, key(1, "udp")).Active, "the brief session outlived UDPIdleTimeout")
	time.Sleep(1500 * time.Millisecond) // past UDPIdleTimeout, within UDPStreamTimeout
	sendUDP(t, stream, at, "after a pause")
	assert.Equal(t, uint64(2), stats(t, p, key(1, "udp")).Accepted, "the stream's session idled out as a brief one")
}

// TestUDPDefaultIdleTimeout: without an option a session lasts 30 s, not
// kube-proxy's 250 ms, and a stream 120 s.
func TestUDPDefaultIdleTimeout(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, 30*time.Second, o.UDPIdleTimeout)
	assert.Equal(t, 120*time.Second, o.UDPStreamTimeout)
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	c := udpClient(t)
	sendUDP(t, c, w.at(key(1, "udp")), "one")
	time.Sleep(time.Second)
	sendUDP(t, c, w.at(key(1, "udp")), "two")
	assert.Equal(t, uint64(1), stats(t, p, key(1, "udp")).Accepted, "a second of silence ended the session")
}

// TestUDPStaleSessions: a session to an endpoint that stopped serving
// ends at the sync (the client's next datagram goes to a serving one);
// one to an endpoint drained to weight 0 goes on.
func TestUDPStaleSessions(t *testing.T) {
	w := newWorld(t, 3)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "udp"))
	c := udpClient(t)
	name, _ := sendUDP(t, c, at, "x")
	require.Equal(t, "ep-0", name)

	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, weighted(0, ep(0)), ep(1))))
	name, _ = sendUDP(t, c, at, "x")
	assert.Equal(t, "ep-0", name, "a drained endpoint lost its session")
	name, _ = askUDP(t, at)
	assert.Equal(t, "ep-1", name, "a new client went to a drained endpoint")

	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(2))))
	name, _ = sendUDP(t, c, at, "x")
	assert.Equal(t, "ep-2", name, "the session to a removed endpoint went on")
	assert.Equal(t, uint64(2), stats(t, p, key(1, "udp")).Drained)
}

// TestUDPStaleSessionEndsWithSync: a sync that finds a session's
// endpoint stale ends it before it returns, so that the client's very
// next datagram starts a new session: none is lost to the old one.
func TestUDPStaleSessionEndsWithSync(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{})
	c := udpClient(t)
	for i := range 100 {
		mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(i%2))))
		require.Zero(t, stats(t, p, key(1, "udp")).Active, "round %d: the stale session outlived the sync", i)
		name, _ := sendUDP(t, c, w.at(key(1, "udp")), "x")
		require.Equal(t, fmt.Sprintf("ep-%d", i%2), name, "round %d", i)
	}
}

// TestSessionsCloseIfRemoves: the sessions closeIf ends leave the table
// before it returns, whatever their goroutines do, and count no longer.
func TestSessionsCloseIfRemoves(t *testing.T) {
	ss := newSessions()
	ps := &portState{}
	client := netip.MustParseAddrPort("10.0.0.1:4000")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer w.Close()
	sd, err := newSide(r)
	require.NoError(t, err)
	b := &budget{max: 1, portMax: 1}
	require.True(t, b.admit(ps))
	s := &session{ps: ps, budget: b, client: client, s: sd}
	require.True(t, ss.add(s))
	ps.stats.active.Add(1)
	require.Equal(t, 1, ss.closeIf(func(*session) bool { return true }))
	assert.Nil(t, ss.get(client), "an ended session still takes its client's datagrams")
	assert.Zero(t, ps.stats.active.Load())
	assert.Zero(t, b.flows.Load(), "the session's flow was not given back")
	assert.False(t, ss.remove(s), "an ended session was removed twice")
}

// TestUDPNoEndpoints: a UDP port without endpoints has no socket: the
// kernel answers with an ICMP port unreachable.
func TestUDPNoEndpoints(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1)))
	c, err := net.Dial("udp", w.at(key(1, "udp")).String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("anyone?"))
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 64))
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
}

// TestUDPDrop: a datagram the verdict drops is discarded, silently.
func TestUDPDrop(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	s := service(1, ep(0))
	s.InternalTrafficPolicy = servicelb.PolicyLocal
	mustSync(t, p, mustState(t, servicelb.NodeConfig{NodeName: "here"}, s))
	c, err := net.Dial("udp", w.at(key(1, "udp")).String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("anyone?"))
	require.NoError(t, err)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = c.Read(make([]byte, 64))
	assert.True(t, isTimeout(err), "want silence, got %v", err)
	assert.Equal(t, uint64(1), stats(t, p, key(1, "udp")).Refused)
}

// TestUDPSessionBound: beyond MaxUDPSessions, new clients' datagrams are
// dropped while the sessions under way go on.
func TestUDPSessionBound(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{MaxUDPSessions: 2})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	at := w.at(key(1, "udp"))
	a, b := udpClient(t), udpClient(t)
	sendUDP(t, a, at, "a")
	sendUDP(t, b, at, "b")
	third, err := net.Dial("udp", at.String())
	require.NoError(t, err)
	defer third.Close()
	_, err = third.Write([]byte("c"))
	require.NoError(t, err)
	third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err = third.Read(make([]byte, 64))
	assert.True(t, isTimeout(err), "a third session: %v", err)
	sendUDP(t, a, at, "a again")
	assert.Equal(t, uint64(1), stats(t, p, key(1, "udp")).SessionsDropped)
}

// TestUDPUnrepliedEvicted: when the listener holds its most sessions, or
// the flow budget is spent, a new client takes the place of the oldest
// session that never had a reply; sessions that had one stay, and with
// every session answered a new client finds no room.
func TestUDPUnrepliedEvicted(t *testing.T) {
	// The endpoint answers every datagram but "flood".
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) != "flood" {
				_, _ = pc.WriteToUDPAddrPort(append([]byte("ep-0 "), buf[:n]...), from)
			}
		}
	}()
	for _, o := range []Options{{MaxUDPSessions: 3}, {MaxFlows: 3, MaxPortFlows: 3}} {
		w := newWorld(t, 0)
		w.real[netip.AddrPortFrom(epAddr(0), udpTarget)] = pc.LocalAddr().(*net.UDPAddr).AddrPort()
		p := newProxier(t, w, o)
		mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
		at := w.at(key(1, "udp"))
		answered := udpClient(t)
		name, _ := sendUDP(t, answered, at, "hello")
		require.Equal(t, "ep-0", name)
		for range 2 {
			_, err := udpClient(t).WriteToUDPAddrPort([]byte("flood"), at)
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool { return stats(t, p, key(1, "udp")).Active == 3 }, 2*time.Second, 5*time.Millisecond)
		for i := range 2 {
			name, _ := sendUDP(t, udpClient(t), at, "new")
			assert.Equal(t, "ep-0", name, "%+v: new client %d", o, i)
		}
		name, _ = sendUDP(t, answered, at, "again")
		assert.Equal(t, "ep-0", name, "%+v: the answered session", o)
		s := stats(t, p, key(1, "udp"))
		assert.Equal(t, uint64(2), s.Evicted, "%+v", o)
		assert.Zero(t, s.SessionsDropped+s.Shed, "%+v", o)
		// Every session has had a reply: a new client finds no room.
		_, err := udpClient(t).WriteToUDPAddrPort([]byte("late"), at)
		require.NoError(t, err)
		assert.Eventually(t, func() bool { s := stats(t, p, key(1, "udp")); return s.SessionsDropped+s.Shed == 1 },
			2*time.Second, 5*time.Millisecond, "%+v", o)
	}
}

// TestUDPEndpointRefuses: an endpoint that answers with an ICMP port
// unreachable ends the session: the next datagram finds another.
func TestUDPEndpointRefuses(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(5))))
	at := w.at(key(1, "udp"))
	c := udpClient(t)
	_, err := c.WriteToUDPAddrPort([]byte("x"), at)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s := stats(t, p, key(1, "udp"))
		return s.Accepted == 1 && s.Active == 0 && s.DialErrors == 1
	}, 3*time.Second, 10*time.Millisecond, "the session did not end")
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	name, _ := sendUDP(t, c, at, "y")
	assert.Equal(t, "ep-0", name)
}
