//go:build privileged

package iptables

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// fakeCleaner records the stale-flow filters it is given and fails while
// fail is set.
type fakeCleaner struct {
	mu    sync.Mutex
	fail  bool
	calls [][]servicelb.StaleFlow
}

var errCleaner = errors.New("conntrack table unreachable")

func (c *fakeCleaner) DeleteStale(_ context.Context, flows []servicelb.StaleFlow) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, slices.Clone(flows))
	if c.fail {
		return 0, errCleaner
	}
	return len(flows), nil
}

// take returns the calls since the last take.
func (c *fakeCleaner) take() [][]servicelb.StaleFlow {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

var _ conntrack.FlowCleaner = (*fakeCleaner)(nil)

// TestStaleFlows checks which stale-flow filters each sync hands the
// flow cleaner: every UDP and SCTP frontend of the state on the first
// sync and on a repair, the frontends a change touched otherwise; and
// that filters whose deletion failed are handed again by the next sync,
// a later change of the same frontend replacing them, until a deletion
// succeeds.
func TestStaleFlows(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptstale")
	fc := &fakeCleaner{}
	px := newProxier(t, h, Options{Conntrack: fc, Families: []servicelb.Family{servicelb.IPv4}})
	b, err := servicelb.NewBuilder(richNode())
	require.NoError(t, err)
	dns := func(eps ...string) servicelb.Service {
		s := servicelb.Service{Name: "t/dns", ClusterIPs: addrs("10.96.0.53"),
			Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}}
		for _, a := range eps {
			s.Endpoints = append(s.Endpoints, ep(a, "node-b"))
		}
		return s
	}
	web := servicelb.Service{Name: "t/web", ClusterIPs: addrs("10.96.0.80"),
		Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 80}}, Endpoints: []servicelb.Endpoint{ep("10.244.1.8", "node-b")}}
	sync := func(s ...servicelb.Service) (*servicelb.State, error) {
		t.Helper()
		for _, svc := range s {
			require.NoError(t, b.Upsert(svc))
		}
		st := b.State()
		err := servicetest.SyncErr(px.Sync(ctx, st))
		return st, err
	}
	frontend := func(port uint16, serving ...string) servicelb.StaleFlow {
		ip := map[uint16]string{53: "10.96.0.53", 80: "10.96.0.80"}[port]
		var eps []netip.AddrPort
		for _, a := range addrs(serving...) {
			eps = append(eps, netip.AddrPortFrom(a, port))
		}
		return servicelb.StaleFlow{Protocol: servicelb.UDP, Dst: netip.MustParseAddr(ip), Port: port, Serving: eps}
	}

	st, err := sync(dns("10.244.1.2", "10.244.2.2"), web)
	require.NoError(t, err)
	assert.Equal(t, [][]servicelb.StaleFlow{st.StaleFlows()}, fc.take(), "first sync: every frontend of the state")
	require.Len(t, st.StaleFlows(), 2)

	fc.fail = true
	_, err = sync(dns("10.244.1.2"))
	require.ErrorIs(t, err, errCleaner)
	want := []servicelb.StaleFlow{frontend(53, "10.244.1.2")}
	assert.Equal(t, [][]servicelb.StaleFlow{want}, fc.take(), "an endpoint left")

	fc.fail = false
	_, err = sync()
	require.NoError(t, err)
	assert.Equal(t, [][]servicelb.StaleFlow{want}, fc.take(), "the same state again: the failed deletion retried")
	_, err = sync()
	require.NoError(t, err)
	assert.Empty(t, fc.take(), "nothing left to delete")

	// Two failed syncs: the second change of t/dns replaces its filter,
	// t/web's stays.
	fc.fail = true
	web2 := web
	web2.Endpoints = []servicelb.Endpoint{ep("10.244.1.9", "node-b")}
	_, err = sync(dns("10.244.1.2", "10.244.3.2"), web2)
	require.ErrorIs(t, err, errCleaner)
	_, err = sync(dns("10.244.3.2"))
	require.ErrorIs(t, err, errCleaner)
	fc.take()
	fc.fail = false
	_, err = sync()
	require.NoError(t, err)
	assert.Equal(t, [][]servicelb.StaleFlow{{frontend(53, "10.244.3.2"), frontend(80, "10.244.1.9")}}, fc.take(), "pending filters, one per frontend")

	// A repair reconciles the whole table.
	h.Exec(t, "iptables-nft", "-t", "nat", "-F")
	h.Exec(t, "iptables-nft", "-t", "nat", "-X")
	st, err = sync()
	require.NoError(t, err)
	assert.Equal(t, [][]servicelb.StaleFlow{st.StaleFlows()}, fc.take(), "repair: every frontend of the state")
}
