//go:build privileged || vm

package nftables_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var errCleaner = errors.New("conntrack unavailable")

// fakeCleaner records the stale-flow filters each call gets, and fails
// while fail is set.
type fakeCleaner struct {
	mu    sync.Mutex
	calls [][]servicelb.StaleFlow
	fail  bool
}

func (c *fakeCleaner) DeleteStale(_ context.Context, fs []servicelb.StaleFlow) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, fs)
	if c.fail {
		return 0, errCleaner
	}
	return len(fs), nil
}

// take returns the calls so far and forgets them.
func (c *fakeCleaner) take() [][]servicelb.StaleFlow {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

// TestStaleFlowFilters: the first sync and every full rewrite reconcile
// every UDP and SCTP frontend of the state (State.StaleFlows); a change
// deletes the flows it made stale (Changes.StaleFlows); a failed deletion
// is retried on the next Sync, brought up to date with the changes since.
func TestStaleFlowFilters(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "stale")
	ct := &fakeCleaner{}
	// A deep check on every sync, so that the flushed table below is
	// repaired at once.
	p := newProxier(t, h, nftables.Options{Conntrack: ct, VerifyInterval: time.Nanosecond})
	a, b := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.2")
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netip.MustParseAddr("198.51.100.1")}}
	svc := servicelb.Service{Name: "default/dns", ClusterIPs: []netip.Addr{clusterIP4},
		Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53, NodePort: 30053}}}
	state := func(from *servicelb.State, eps ...netip.Addr) *servicelb.State {
		s := svc
		for _, e := range eps {
			s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: e})
		}
		if from == nil {
			return mustState(t, node, s)
		}
		ed := from.Edit()
		require.NoError(t, ed.Upsert(s))
		return ed.State()
	}
	both := state(nil, a, b)
	mustSync(t, p, both)
	require.Equal(t, [][]servicelb.StaleFlow{both.StaleFlows()}, ct.take(), "first sync")
	mustSync(t, p, both)
	require.Empty(t, ct.take(), "unchanged state")

	onlyA := state(both, a)
	ch := servicelb.Diff(both, onlyA)
	ct.fail = true
	require.ErrorIs(t, servicetest.SyncErr(p.Sync(testCtx(t), onlyA)), errCleaner)
	require.Equal(t, [][]servicelb.StaleFlow{ch.StaleFlows()}, ct.take(), "change")
	ct.fail = false
	mustSync(t, p, onlyA)
	require.Equal(t, [][]servicelb.StaleFlow{ch.StaleFlows()}, ct.take(), "retry of the failed deletion")
	mustSync(t, p, onlyA)
	require.Empty(t, ct.take(), "after a successful deletion")

	// A pending filter follows its frontend: b serving again keeps its
	// flows when the deletion is retried.
	onlyB := state(onlyA, b)
	ct.fail = true
	require.ErrorIs(t, servicetest.SyncErr(p.Sync(testCtx(t), onlyB)), errCleaner)
	ct.take()
	ct.fail = false
	again := state(onlyB, a, b)
	mustSync(t, p, again)
	calls := ct.take()
	require.Len(t, calls, 1)
	for _, f := range calls[0] {
		require.Equal(t, []netip.AddrPort{netip.AddrPortFrom(a, 53), netip.AddrPortFrom(b, 53)}, f.Serving, "retried filter %v", f)
	}

	// A repair of the table reconciles every frontend again, and so does
	// a new proxier adopting the table.
	h.Exec(t, "nft", "flush", "table", "inet", nftables.DefaultTable)
	mustSync(t, p, again)
	require.Equal(t, [][]servicelb.StaleFlow{again.StaleFlows()}, ct.take(), "repair")
	q := newProxier(t, h, nftables.Options{Conntrack: ct})
	mustSync(t, q, again)
	require.Equal(t, [][]servicelb.StaleFlow{again.StaleFlows()}, ct.take(), "adoption")
	// Without cleanup, nothing is asked for.
	r := newProxier(t, h, nftables.Options{Conntrack: ct, NoConntrackCleanup: true})
	mustSync(t, r, both)
	require.Empty(t, ct.take(), "NoConntrackCleanup")
}
