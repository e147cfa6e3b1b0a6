package servicelb

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

// externalOn returns a service of one TCP port whose external IP is ip.
func externalOn(name, vip, ip string) Service {
	s := simple(name, vip, "10.0.0.1")
	s.Ports = s.Ports[:1]
	s.ExternalIPs = []netip.Addr{a(ip)}
	return s
}

// holder returns who holds the external IP 192.0.2.1:80/TCP in st.
func holder(t *testing.T, st *State) string {
	t.Helper()
	for _, c := range st.Conflicts() {
		if c.Frontend == "192.0.2.1:80/TCP" {
			return c.Winner
		}
	}
	for _, sp := range st.Ports() {
		if slices.Contains(sp.ExternalIPs, a("192.0.2.1")) {
			return sp.Key.Service
		}
	}
	return ""
}

// A Builder gives a frontend whose holder leaves to its earliest other
// claimant; a Builder that edits a State counts the claims of the State
// as made together, so the rules (the name) choose among those that did
// not hold it, and claims made after the edit come after them. Neither
// Builder changes the State, nor the other.
func TestEditCountsTheStatesClaimsAsMadeTogether(t *testing.T) {
	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	for _, s := range []Service{
		externalOn("a", "10.96.0.1", "192.0.2.1"),
		externalOn("c", "10.96.0.3", "192.0.2.1"),
		externalOn("b", "10.96.0.2", "192.0.2.1"),
	} {
		require.NoError(t, b.Upsert(s))
	}
	s := b.State()
	require.Equal(t, "a", holder(t, s))

	e := s.Edit()
	require.NoError(t, e.Upsert(externalOn("0-later", "10.96.0.9", "192.0.2.1")))
	require.True(t, e.Delete("a"))
	require.True(t, b.Delete("a"))
	require.Equal(t, "c", holder(t, b.State()), "the running Builder: the earliest claimant")
	require.Equal(t, "b", holder(t, e.State()), "the edited State: the rules, before a later claim")
	require.Equal(t, "a", holder(t, s), "the State itself")

	require.True(t, e.Delete("b"))
	require.Equal(t, "c", holder(t, e.State()))
	require.True(t, e.Delete("c"))
	require.Equal(t, "0-later", holder(t, e.State()))
	require.Equal(t, "c", holder(t, b.State()), "the running Builder after the other's changes")
}

// indexed returns a Builder that starts from s by indexing every service
// of it: what Edit did before it shared the State's index, and still does
// for a State from Without.
func indexed(s *State) *Builder {
	b := &Builder{node: s.node, w: mapWriter{serviceMap: s.svcs, o: &owner{}}}
	b.index(s)
	return b
}

// claimant returns a random service that asks for frontends that others
// ask for too: external IPs (one of them a node address), node ports and
// health check node ports drawn from small pools.
func claimant(r *rand.Rand, i int) Service {
	s := Service{
		Name:       fmt.Sprintf("s%02d", r.IntN(12)),
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})},
		Ports:      []Port{{Name: "p", Protocol: []Protocol{TCP, UDP}[r.IntN(2)], Port: 80}},
		Endpoints:  []Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + r.IntN(3))})}},
	}
	for _, ip := range []string{"192.0.2.1", "192.0.2.2", "198.51.100.1"} {
		if r.IntN(3) == 0 {
			s.ExternalIPs = append(s.ExternalIPs, a(ip))
		}
	}
	if r.IntN(2) == 0 {
		s.Ports[0].NodePort = uint16(30080 + r.IntN(3))
	}
	if r.IntN(3) == 0 {
		s.Ports[0].Port = uint16(30080 + r.IntN(3))
	}
	if r.IntN(4) == 0 {
		s.ExternalTrafficPolicy = PolicyLocal
		s.HealthCheckNodePort = uint16(30081 + r.IntN(3))
	}
	return s
}

// conflictsByRules returns the clashes with their losers sorted: an index
// orders the losers it finds by the rules, and a shared one by when they
// asked until a change touches them.
func conflictsByRules(st *State) []Conflict {
	cs := st.Conflicts()
	for i := range cs {
		cs[i].Losers = slices.Sorted(slices.Values(cs[i].Losers))
	}
	return cs
}

// A Builder that edits a State holds what one that indexes every service
// of it holds, change after change, over random services that clash, and
// so does a Builder that edits a State of that Builder in turn.
func TestEditEqualsAnIndexOfTheState(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("198.51.100.1")}}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		b, err := NewBuilder(node)
		require.NoError(t, err)
		i := 0
		change := func(bs ...*Builder) {
			i++
			if r.IntN(4) == 0 {
				name := fmt.Sprintf("s%02d", r.IntN(12))
				for _, b := range bs {
					b.Delete(name)
				}
				return
			}
			svcs := make([]Service, 1+r.IntN(3))
			for j := range svcs {
				svcs[j] = claimant(r, i*4+j)
			}
			for _, b := range bs {
				_, _ = b.upsertBatch(svcs)
			}
		}
		for range 20 {
			change(b)
			if r.IntN(3) == 0 {
				b.State()
			}
		}
		s := b.State()
		orig, before := s, s.Ports()
		for range 3 {
			shared, fresh := s.Edit(), indexed(s)
			require.Empty(t, cmp.Diff(conflictsByRules(fresh.State()), conflictsByRules(shared.State())), "seed %d", seed)
			for range 15 {
				change(shared, fresh)
				if r.IntN(3) == 0 {
					shared.State()
				}
				got, want := shared.State(), fresh.State()
				require.Empty(t, cmp.Diff(want.Ports(), got.Ports()), "seed %d", seed)
				require.Empty(t, cmp.Diff(conflictsByRules(want), conflictsByRules(got)), "seed %d", seed)
			}
			change(b) // the first Builder goes on beside them
			s = shared.State()
		}
		require.Empty(t, cmp.Diff(before, orig.Ports()), "seed %d: the State edited changed", seed)
	}
}

// Edit shares the State's services and its index of their frontends: it
// allocates what the State's conflicts need, whatever the number of
// services.
func TestEditDoesNotWalkTheServices(t *testing.T) {
	svcs := make([]Service, 10000)
	for i := range svcs {
		svcs[i] = simple(fmt.Sprintf("s%05d", i), netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String(), "10.0.0.1")
	}
	s, err := NewState(NodeConfig{}, svcs...)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(20, func() { s.Edit() })
	require.Less(t, allocs, 20.0)
}
