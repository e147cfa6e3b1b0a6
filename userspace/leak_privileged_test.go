//go:build privileged

package userspace

import (
	"context"
	"io"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// openFiles counts the process's open file descriptors.
func openFiles(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(fds)
}

// settle waits for the goroutines and open files to come back to at most
// goroutines and files, and fails with what is left over otherwise.
func settle(t *testing.T, what string, goroutines, files int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > goroutines || openFiles(t) > files {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%s: %d goroutines (want %d) and %d open files (want %d) left:\n%s",
				what, runtime.NumGoroutine(), goroutines, openFiles(t), files, buf)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoLeaks: a proxy in another namespace that holds its addresses,
// with a TCP connection and a UDP session under way, leaves after
// Cleanup nothing but its namespace's thread and its netlink socket
// (which a later Sync uses), and after Close no goroutine and no open
// file at all.
func TestNoLeaks(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", tcpTarget)
	tp.Backends[0].Serve(t, "udp", udpTarget)
	dial := clientDialer(t, tp.Client)
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10", "fd00:96::10"),
		Ports: []servicelb.Port{{Name: "tcp", Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget},
			{Name: "udp", Protocol: servicelb.UDP, Port: 53, TargetPort: udpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}, {Addr: netnstest.BackendIPv6(0)}}}
	st := mustState(t, servicelb.NodeConfig{}, s)
	// Let the topology's and the servers' own goroutines start first.
	time.Sleep(100 * time.Millisecond)
	goroutines, files := runtime.NumGoroutine(), openFiles(t)

	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true})
	require.NoError(t, err)
	serve := func() {
		mustSync(t, p, st)
		// A connection that stays open (the endpoint waits for a line),
		// and a UDP session.
		c, err := dial(servicelb.TCP, netip.MustParseAddrPort("10.96.0.10:80"))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		r, err := tp.Client.Ask(context.Background(), "udp", netip.MustParseAddrPort("[fd00:96::10]:53"))
		require.NoError(t, err)
		require.Equal(t, "backend-0", r.Host)
		require.Eventually(t, func() bool { return p.activeConns() == 1 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, p.Cleanup(context.Background()))
		// The connection was reset.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		require.Error(t, err)
		require.NotErrorIs(t, err, io.EOF)
		c.Close()
	}
	serve()
	// The namespace's thread; the netlink socket of the held addresses.
	settle(t, "after Cleanup", goroutines+1, files+1)
	serve()
	require.NoError(t, p.Close())
	settle(t, "after Close", goroutines, files)
}
