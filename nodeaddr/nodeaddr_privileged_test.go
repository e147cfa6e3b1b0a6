//go:build privileged || vm

package nodeaddr_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nodeaddr"
)

func mustAddrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// TestList: the addresses of a namespace's interfaces, sorted, without
// loopback, IPv6 link-local addresses and those of excluded links.
func TestList(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	node := tp.Node
	got, err := nodeaddr.List(nodeaddr.Options{NetNS: node.NS})
	require.NoError(t, err)
	assert.Contains(t, got, netnstest.NodeIPv4())
	assert.Contains(t, got, netnstest.NodeIPv6())
	for _, a := range got {
		assert.False(t, a.IsLoopback() || a.Is6() && a.IsLinkLocalUnicast(), "%s listed", a)
	}
	assert.True(t, slicesSorted(got), "not sorted: %v", got)

	node.Exec(t, "ip", "link", "add", "extra0", "type", "veth", "peer", "name", "extra1")
	node.Exec(t, "ip", "addr", "add", "192.0.2.7/32", "dev", "extra0")
	node.Exec(t, "ip", "addr", "add", "192.0.2.8/32", "dev", "extra1")
	got, err = nodeaddr.List(nodeaddr.Options{NetNS: node.NS, ExcludeInterfaces: []string{"extra1"}})
	require.NoError(t, err)
	assert.Contains(t, got, netip.MustParseAddr("192.0.2.7"))
	assert.NotContains(t, got, netip.MustParseAddr("192.0.2.8"))
}

func slicesSorted(as []netip.Addr) bool {
	for i := 1; i < len(as); i++ {
		if as[i-1].Compare(as[i]) >= 0 {
			return false
		}
	}
	return true
}

// TestWatcher: Run reports the addresses at once, then each change: an
// address added to an interface, one removed, an interface deleted with
// its addresses; a change on an excluded link is no change. It ends when
// its context does.
func TestWatcher(t *testing.T) {
	h := netnstest.NewHost(t, "nodeaddr")
	h.Exec(t, "ip", "link", "add", "ext0", "type", "veth", "peer", "name", "ipvs0")
	h.Exec(t, "ip", "link", "set", "ext0", "up")
	h.Exec(t, "ip", "addr", "add", "192.0.2.1/24", "dev", "ext0")
	var mu sync.Mutex
	var updates [][]netip.Addr
	last := func() []netip.Addr {
		mu.Lock()
		defer mu.Unlock()
		if len(updates) == 0 {
			return nil
		}
		return updates[len(updates)-1]
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(updates)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	w := nodeaddr.Watcher{Options: nodeaddr.Options{NetNS: h.NS, ExcludeInterfaces: []string{"ipvs0"}}, Settle: 20 * time.Millisecond}
	go func() {
		done <- w.Run(ctx, func(as []netip.Addr) {
			mu.Lock()
			defer mu.Unlock()
			updates = append(updates, as)
		})
	}()
	eventually := func(want []netip.Addr, what string) {
		t.Helper()
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, last()) }, 5*time.Second, 10*time.Millisecond,
			"%s: last update %v, want %v", what, last(), want)
	}
	eventually(mustAddrs("192.0.2.1"), "at start")
	h.Exec(t, "ip", "addr", "add", "2001:db8::1/64", "dev", "ext0")
	h.Exec(t, "ip", "addr", "add", "198.51.100.9/32", "dev", "ext0")
	eventually(mustAddrs("192.0.2.1", "198.51.100.9", "2001:db8::1"), "after two addresses were added")
	n := count()
	h.Exec(t, "ip", "addr", "add", "10.96.0.1/32", "dev", "ipvs0")
	h.Exec(t, "ip", "addr", "del", "198.51.100.9/32", "dev", "ext0")
	eventually(mustAddrs("192.0.2.1", "2001:db8::1"), "after one was removed")
	assert.Equal(t, n+1, count(), "an address on the excluded link made an update")
	h.Exec(t, "ip", "link", "del", "ext0")
	eventually(nil, "after the link was deleted")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}
