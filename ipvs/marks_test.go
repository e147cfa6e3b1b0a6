package ipvs

import (
	"context"
	"errors"
	"log/slog"
	"math/bits"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func unit(svc string, f servicelb.Family) markUnit {
	return markUnit{key: servicelb.ServicePortKey{Service: svc, Port: "p", Family: f}, action: servicelb.ToCluster}
}

// TestMarkSpace checks that the marks of a mask are made of its bits
// only, distinct, and all of them, also for a mask in pieces.
func TestMarkSpace(t *testing.T) {
	for _, mask := range []uint32{0x0fff0000, 0x00030000, 0x80010100} {
		s := markSpace{mask}
		require.Equal(t, uint64(1)<<bits.OnesCount32(mask)-1, s.slots())
		seen := map[uint32]bool{}
		for n := uint64(1); n <= min(s.slots(), 5000); n++ {
			m := s.mark(n)
			require.NotZero(t, m)
			require.Zero(t, m&^mask, "mark %#x of slot %d has bits outside %#x", m, n, mask)
			require.False(t, seen[m], "mark %#x twice", m)
			seen[m] = true
			require.True(t, s.owns(m|0x4000))
		}
	}
	require.Equal(t, uint32(0x80010000), markSpace{0x80010100}.mark(6))
	require.False(t, markSpace{DefaultFWMarkMask}.owns(0x4000))
}

// TestMarksDeterministic checks that the marks of a set of units do not
// depend on the order the units come in (a restarted proxier gives the
// same ones), are distinct within a family and may repeat across
// families, and that a unit keeps its mark when others that do not
// collide with it come and go.
func TestMarksDeterministic(t *testing.T) {
	s := markSpace{0x000f0000}
	var units []markUnit
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		units = append(units, unit(name, servicelb.IPv4), unit(name, servicelb.IPv6))
	}
	want, err := s.allocate(units)
	require.NoError(t, err)
	for i := range 20 {
		shuffled := slices.Clone(units)
		slices.Reverse(shuffled)
		shuffled = append(shuffled[i%len(shuffled):], shuffled[:i%len(shuffled)]...)
		got, err := s.allocate(shuffled)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, f := range families() {
		seen := map[uint32]markUnit{}
		for u, m := range want {
			if u.key.Family == f {
				require.NotContains(t, seen, m, "%s and %s share mark %#x", u, seen[m], m)
				seen[m] = u
			}
		}
	}
	// A lone unit sits at its home.
	lone, err := s.allocate(units[:1])
	require.NoError(t, err)
	require.Equal(t, s.mark(s.home(units[0])), lone[units[0]])
	// Too many units for the space.
	var many []markUnit
	for i := range 16 {
		many = append(many, unit(string(rune('a'+i)), servicelb.IPv4))
	}
	_, err = s.allocate(many)
	require.ErrorIs(t, err, servicelb.ErrCapacity)
}

// flakyCleaner is a FlowCleaner that fails while fail is set and records
// what it was asked to delete.
type flakyCleaner struct {
	fail  bool
	calls [][]servicelb.StaleFlow
}

func (c *flakyCleaner) DeleteStale(_ context.Context, flows []servicelb.StaleFlow) (int, error) {
	c.calls = append(c.calls, flows)
	if c.fail {
		return 0, errors.New("netlink: no buffer space")
	}
	return len(flows), nil
}

// TestStaleFlowsRetried checks that stale flows whose deletion failed are
// handed over again by the next attempt, with the endpoints that serve
// their frontend by then, and forgotten once deleted.
func TestStaleFlowsRetried(t *testing.T) {
	o, _ := Options{}.withDefaults()
	svc := func(eps ...servicelb.Endpoint) *servicelb.State {
		return mustState(t, testNode(), servicelb.Service{Name: "default/dns", ClusterIPs: []netip.Addr{a("10.96.0.53")},
			Ports: []servicelb.Port{{Protocol: udp, Port: 53}}, Endpoints: eps})
	}
	c := &flakyCleaner{fail: true}
	p := &Proxier{opts: o, log: slog.New(slog.DiscardHandler), cleaner: c, stale: map[staleKey]bool{}}
	before, after := svc(ep("10.244.1.2", "node-a"), ep("10.244.2.2", "node-b")), svc(ep("10.244.2.2", "node-b"))
	ch := servicelb.Diff(before, after)
	var err error
	p.plan, err = planState(after, &o)
	require.NoError(t, err)
	p.addStale(ch.StaleFlows())
	require.Error(t, p.cleanFlows(t.Context()))
	require.Len(t, p.stale, 1, "a failed deletion stays pending")

	// Another endpoint serves by the time the deletion is tried again.
	later := svc(ep("10.244.2.2", "node-b"), ep("10.244.3.2", "node-b"))
	p.plan, err = planState(later, &o)
	require.NoError(t, err)
	c.fail = false
	require.NoError(t, p.cleanFlows(t.Context()))
	require.Equal(t, []servicelb.StaleFlow{{Protocol: udp, Dst: a("10.96.0.53"), Port: 53,
		Serving: []netip.Addr{a("10.244.2.2"), a("10.244.3.2")}}}, c.calls[len(c.calls)-1])
	require.Empty(t, p.stale)
	require.NoError(t, p.cleanFlows(t.Context()))
	require.Len(t, c.calls, 2, "nothing pending: nothing handed over")
}
