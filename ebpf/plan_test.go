//go:build linux

package ebpf

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// packetPath stands for a packet-path backend that expresses everything.
type packetPath struct{}

func (packetPath) Sync(_ context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	return servicelb.SyncReport{Applied: st}, nil
}
func (packetPath) Cleanup(context.Context) error { return nil }
func (packetPath) Close() error                  { return nil }
func (packetPath) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "packets", Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom},
		Features: servicelb.AllFeatures}
}

func ep(s string) endpoint {
	ap := netip.MustParseAddrPort(s)
	return newEndpoint(ap.Addr(), ap.Port())
}

func TestSocketAction(t *testing.T) {
	fwd := func(a servicelb.Action, masq bool) servicelb.Verdict {
		return servicelb.Verdict{Action: a, Masquerade: masq}
	}
	for _, tc := range []struct {
		name   string
		v      servicelb.Verdict
		origin servicelb.Origin
		kind   servicelb.FrontendKind
		ranges bool
		paired bool
		act    action
		role   role
	}{
		{"pod unmasqueraded: the pod's own address", fwd(servicelb.ToCluster, false), servicelb.FromPod, servicelb.ClusterIPFrontend, false, true, actForward, roleCluster},
		{"pod masqueraded: the packet path", fwd(servicelb.ToCluster, true), servicelb.FromPod, servicelb.NodePortFrontend, false, true, actPass, 0},
		{"node masqueraded: the node's address toward the endpoint", fwd(servicelb.ToCluster, true), servicelb.FromNode, servicelb.ExternalIPFrontend, false, true, actForward, roleCluster},
		{"node unmasqueraded: the packet path", fwd(servicelb.ToCluster, false), servicelb.FromNode, servicelb.ClusterIPFrontend, false, true, actPass, 0},
		{"local set", fwd(servicelb.ToLocal, false), servicelb.FromPod, servicelb.ClusterIPFrontend, false, true, actForward, roleLocal},
		{"reject: the packet path's ICMP error", fwd(servicelb.Reject, false), servicelb.FromNode, servicelb.ClusterIPFrontend, false, true, actPass, 0},
		{"drop: the packet path's silence", fwd(servicelb.Drop, false), servicelb.FromPod, servicelb.ClusterIPFrontend, false, true, actPass, 0},
		{"reject alone: at the socket", fwd(servicelb.Reject, false), servicelb.FromNode, servicelb.ClusterIPFrontend, false, false, actReject, 0},
		{"drop alone: at the socket", fwd(servicelb.Drop, false), servicelb.FromPod, servicelb.ClusterIPFrontend, false, false, actDrop, 0},
		{"source ranges: the packet path", fwd(servicelb.ToCluster, true), servicelb.FromNode, servicelb.LoadBalancerFrontend, true, true, actPass, 0},
		{"source ranges hold for load-balancer IPs only", fwd(servicelb.ToCluster, true), servicelb.FromNode, servicelb.NodePortFrontend, true, true, actForward, roleCluster},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &servicelb.ServicePort{}
			var vs servicelb.Verdicts
			vs[tc.origin] = tc.v
			sp.Internal, sp.External = vs, vs
			if tc.ranges {
				sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
			}
			a, r := socketAction(sp, tc.kind, tc.origin, tc.paired)
			assert.Equal(t, tc.act, a)
			assert.Equal(t, tc.role, r)
		})
	}
}

// TestPodAction: a pod's socket takes its verdict at the socket when
// the node tells pods by their namespace, or when the pod and outside
// verdicts agree; otherwise the packet path decides which it is.
func TestPodAction(t *testing.T) {
	pod := servicelb.Verdict{Action: servicelb.ToCluster}
	outside := servicelb.Verdict{Action: servicelb.ToCluster, Masquerade: true}
	for _, tc := range []struct {
		name        string
		outside     servicelb.Verdict
		byNamespace bool
		act         action
	}{
		{"by namespace", outside, true, actForward},
		{"verdicts differ", outside, false, actPass},
		{"verdicts agree", pod, false, actForward},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &servicelb.ServicePort{}
			sp.Internal[servicelb.FromPod], sp.Internal[servicelb.FromOutside] = pod, tc.outside
			a, _ := podAction(sp, servicelb.ClusterIPFrontend, tc.byNamespace, true)
			assert.Equal(t, tc.act, a)
		})
	}
}

func TestSlotCounts(t *testing.T) {
	bs := func(ws ...uint16) []servicelb.Backend {
		var out []servicelb.Backend
		for _, w := range ws {
			out = append(out, servicelb.Backend{Weight: w})
		}
		return out
	}
	assert.Equal(t, []int{1, 1, 1}, slotCounts(bs(1, 1, 1)))
	assert.Equal(t, []int{1, 1}, slotCounts(bs(7, 7)))
	assert.Equal(t, []int{1, 2, 3}, slotCounts(bs(1, 2, 3)))
	assert.Equal(t, []int{1, 2}, slotCounts(bs(100, 200)))
	big := slotCounts(bs(65535, 1, 30000))
	assert.Equal(t, 1, big[1], "every endpoint keeps a slot")
	total := 0
	for _, n := range big {
		total += n
	}
	assert.LessOrEqual(t, total, maxSlots+3)
	assert.InDelta(t, 65535.0/30000, float64(big[0])/float64(big[2]), 0.01)
}

func TestRelayout(t *testing.T) {
	a, b, c, d := ep("10.0.0.1:80"), ep("10.0.0.2:80"), ep("10.0.0.3:80"), ep("10.0.0.4:80")
	for _, tc := range []struct {
		name  string
		old   []endpoint
		order []endpoint
		want  map[endpoint]int
		next  []endpoint
	}{
		{"fresh", nil, []endpoint{a, b}, map[endpoint]int{a: 1, b: 1}, []endpoint{a, b}},
		{"added at the end", []endpoint{a, b}, []endpoint{a, b, c}, map[endpoint]int{a: 1, b: 1, c: 1}, []endpoint{a, b, c}},
		{"the last moves into the gap", []endpoint{a, b, c}, []endpoint{a, c}, map[endpoint]int{a: 1, c: 1}, []endpoint{a, c}},
		{"a new one takes the gap", []endpoint{a, b, c}, []endpoint{a, c, d}, map[endpoint]int{a: 1, c: 1, d: 1}, []endpoint{a, d, c}},
		{"weight down", []endpoint{a, a, b}, []endpoint{a, b}, map[endpoint]int{a: 1, b: 1}, []endpoint{a, b}},
		{"weight up", []endpoint{a, b}, []endpoint{a, b}, map[endpoint]int{a: 2, b: 1}, []endpoint{a, b, a}},
		{"all gone", []endpoint{a, b}, nil, map[endpoint]int{}, []endpoint{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.next, relayout(tc.old, tc.order, tc.want))
		})
	}
}

// canonical is content with set ids replaced by set names, so that two
// contents that differ only in how ids were handed out compare equal.
type canonical struct {
	fe      map[feKey]string
	sets    map[string]setVal
	slots   map[string][]endpoint
	members map[string][]endpoint
}

func canon(t *testing.T, c *content) canonical {
	t.Helper()
	name := func(id uint32) string {
		n, ok := c.names[id]
		require.True(t, ok, "set %d has no name", id)
		return n.String()
	}
	out := canonical{fe: map[feKey]string{}, sets: map[string]setVal{}, slots: map[string][]endpoint{}, members: map[string][]endpoint{}}
	for k, v := range c.fe {
		s := fmt.Sprintf("%s %s", v.NodeAct, v.PodAct)
		if v.NodeAct == actForward {
			s += " node:" + name(v.NodeSet)
		}
		if v.PodAct == actForward {
			s += " pod:" + name(v.PodSet)
		}
		out.fe[k] = s
	}
	for id, v := range c.sets {
		out.sets[name(id)] = v
		for i := range v.Count {
			out.slots[name(id)] = append(out.slots[name(id)], c.slots[slotKey{id, i}])
		}
	}
	for k := range c.members {
		out.members[name(k.Set)] = append(out.members[name(k.Set)], k.endpoint)
	}
	// Slot positions follow the history of a set; what counts is how
	// many slots each endpoint holds.
	for _, m := range []map[string][]endpoint{out.members, out.slots} {
		for _, es := range m {
			slices.SortFunc(es, func(a, b endpoint) int { return a.AddrPort().Compare(b.AddrPort()) })
		}
	}
	return out
}

// whole checks what a lookup of the hooks needs of c: every frontend that
// forwards names a set with slots, every slot below a set's count is
// there, and every membership belongs to a set.
func whole(c *content) error {
	for k, v := range c.fe {
		for _, f := range []struct {
			a  action
			id uint32
		}{{v.NodeAct, v.NodeSet}, {v.PodAct, v.PodSet}} {
			if f.a != actForward {
				continue
			}
			s, ok := c.sets[f.id]
			if !ok || s.Count == 0 {
				return fmt.Errorf("frontend %s: set %d missing or empty", k, f.id)
			}
			for i := range s.Count {
				if _, ok := c.slots[slotKey{f.id, i}]; !ok {
					return fmt.Errorf("frontend %s: set %d: slot %d of %d missing", k, f.id, i, s.Count)
				}
			}
		}
	}
	return nil
}

// TestIncrementalEqualsFresh walks random states: each change is planned
// over the model of the last and applied to a content standing in for
// the maps, which after every step of every change is whole (no lookup
// meets half a service), and after each change holds what a fresh plan of
// the state holds, and what the model says.
func TestIncrementalEqualsFresh(t *testing.T) {
	caps := capabilities(packetPath{})
	steps := 400
	if testing.Short() {
		steps = 100
	}
	for seed := range uint64(4) {
		// Even seeds plan as the pair does (refusals left to the packet
		// path), odd ones as the hooks alone (refusals at the socket).
		paired := seed%2 == 0
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			g := servicetest.New(servicetest.Options{Seed: seed, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}})
			walk, err := g.Walk(steps)
			require.NoError(t, err)
			walkPlans(t, walk, &caps, paired)
		})
	}
}

// FuzzPlans walks states drawn from the fuzzer's bytes and checks every
// step as TestIncrementalEqualsFresh does, rendering each model as Render
// does.
func FuzzPlans(f *testing.F) {
	for _, seed := range []string{"", "ebpf", "\x00\x01\x02\x03\x04\x05\x06\x07\x08", "a longer seed that steers more of the walk"} {
		f.Add([]byte(seed))
	}
	caps := capabilities(packetPath{})
	f.Fuzz(func(t *testing.T, data []byte) {
		g := servicetest.New(servicetest.Options{Source: servicetest.Source(data), Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}})
		walk, err := g.Walk(40)
		require.NoError(t, err)
		walkPlans(t, walk, &caps, len(data)%2 == 0)
	})
}

// walkPlans plans each change of walk over the model of the state before
// and applies it to a content standing in for the maps, which after every
// step of every change is whole (no lookup meets half a service), and
// after each change holds what a fresh plan of the state holds, and what
// the model says; the model renders as Render renders it.
func walkPlans(t *testing.T, walk []*servicelb.State, caps *servicelb.Capabilities, paired bool) {
	t.Helper()
	m, err := buildModel(walk[0], caps, nil, paired)
	require.NoError(t, err)
	kernel := m.content(7)
	for i := 1; i < len(walk); i++ {
		ch := servicelb.Diff(walk[i-1], walk[i])
		before := m.content(7)
		s, err := m.plan(walk[i], &ch, caps)
		require.NoError(t, err, "step %d", i)
		require.NoError(t, s.d.run(kernel, func() {
			require.NoError(t, whole(kernel), "step %d: a lookup meets a half-written service", i)
		}))
		m.commit(s)
		fresh, err := buildModel(walk[i], caps, nil, paired)
		require.NoError(t, err)
		require.Equal(t, canon(t, fresh.content(7)), canon(t, kernel), "step %d: incremental differs from fresh", i)
		require.Equal(t, m.content(7), kernel, "step %d: the model differs from the maps", i)
		require.Equal(t, slices.Sorted(maps.Keys(m.ids.used)), setIDsOf(kernel), "step %d: ids in use", i)
		require.Equal(t, sorted(diffContent(before, m.content(7))), sorted(s.d), "step %d: the writes are not what changed", i)
		text := formatContent(m.content(0), &hookContent{}, m.annotations())
		require.Contains(t, text, fmt.Sprintf("map %s: %d entries", mapFrontends, len(kernel.fe)), "step %d: render", i)
	}
}

// sorted returns d with its lists of keys sorted (and empty ones nil),
// for comparing deltas made in different orders.
func sorted(d *delta) delta {
	out := *d
	sortKeys(&out.memberGone)
	sortKeys(&out.members.del)
	sortKeys(&out.slots.del)
	sortKeys(&out.sets.del)
	sortKeys(&out.names.del)
	sortKeys(&out.fe.del)
	sortKeys(&out.setGone)
	sortKeys(&out.slotGone)
	sortKeys(&out.memberDrop)
	return out
}

func sortKeys[K any](keys *[]K) {
	if len(*keys) == 0 {
		*keys = nil
		return
	}
	*keys = slices.Clone(*keys)
	slices.SortFunc(*keys, func(a, b K) int { return strings.Compare(fmt.Sprintf("%#v", a), fmt.Sprintf("%#v", b)) })
}

func setIDsOf(c *content) []uint32 { return slices.Sorted(maps.Keys(c.sets)) }

// TestAdoptionKeepsTheMaps: a model built over the maps a model wrote
// (a restarted Proxier) keeps every id and slot: nothing to write.
func TestAdoptionKeepsTheMaps(t *testing.T) {
	caps := capabilities(packetPath{})
	g := servicetest.New(servicetest.Options{Seed: 9, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}})
	walk, err := g.Walk(60)
	require.NoError(t, err)
	m, err := buildModel(walk[0], &caps, nil, true)
	require.NoError(t, err)
	kernel := m.content(7)
	for i := 1; i < len(walk); i++ {
		ch := servicelb.Diff(walk[i-1], walk[i])
		s, err := m.plan(walk[i], &ch, &caps)
		require.NoError(t, err)
		require.NoError(t, s.d.run(kernel, nil))
		m.commit(s)
	}
	again, err := buildModel(walk[len(walk)-1], &caps, kernel, true)
	require.NoError(t, err)
	assert.Zero(t, diffContent(kernel, again.content(7)).len())
}

func TestParseSetName(t *testing.T) {
	k := servicelb.ServicePortKey{Service: "ns/a:b", Port: "http", Family: servicelb.IPv6}
	got, r, ok := parseSetName(setName(k, roleLocal))
	require.True(t, ok)
	assert.Equal(t, k, got)
	assert.Equal(t, roleLocal, r)
	for _, bad := range []string{"", "x cluster", "a:b/ipv5 cluster", "a:b/ipv4 other"} {
		_, _, ok := parseSetName(bad)
		assert.False(t, ok, bad)
	}
}
