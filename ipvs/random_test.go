//go:build linux

package ipvs

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// fakeKernel is the kernel as the deltas leave it: the virtual servers, the
// set entries and the steers in the keyed chains.
type fakeKernel struct {
	servers map[vsKey]*VirtualServer
	entries map[setEntry]bool
	rules   map[ruleSlot][]xtables.Rule
}

// fakeKernelOf returns the kernel a full sync of p leaves.
func fakeKernelOf(p *model) *fakeKernel {
	m := &fakeKernel{servers: map[vsKey]*VirtualServer{}, entries: map[setEntry]bool{}, rules: map[ruleSlot][]xtables.Rule{}}
	for k, vs := range p.servers {
		m.servers[k] = vs.clone()
	}
	for e := range p.entries {
		m.entries[e] = true
	}
	for _, f := range families() {
		for i, keys := range p.steerRules(f) {
			for key, rules := range keys {
				m.rules[ruleSlot{f, i, key}] = rules
			}
		}
	}
	return m
}

// apply does to the fake kernel what apply does to the kernel for a delta of a
// step.
func (m *fakeKernel) apply(d *delta) {
	for k, vs := range d.servers {
		if vs == nil {
			delete(m.servers, k)
		} else {
			m.servers[k] = vs.clone()
		}
	}
	for _, e := range d.add {
		m.entries[e] = true
	}
	for _, e := range d.del {
		delete(m.entries, e)
	}
	for slot, rules := range d.rules {
		if len(rules) == 0 {
			delete(m.rules, slot)
		} else {
			m.rules[slot] = rules
		}
	}
}

// text renders the fake kernel for comparison.
func (m *fakeKernel) text() string {
	var b strings.Builder
	b.WriteString(RenderVirtualServers(slices.Collect(maps.Values(m.servers))))
	es := slices.SortedFunc(maps.Keys(m.entries), compareEntries)
	for _, e := range es {
		fmt.Fprintf(&b, "%s-%s %s\n", e.set, e.family, e)
	}
	slots := slices.SortedFunc(maps.Keys(m.rules), func(x, y ruleSlot) int {
		return cmp.Or(cmp.Compare(x.family, y.family), cmp.Compare(x.chain, y.chain), cmp.Compare(x.key, y.key))
	})
	for _, s := range slots {
		for _, r := range m.rules[s] {
			fmt.Fprintf(&b, "%s\n", r.AppendSave(nil, xtFamily(s.family), steerChains[s.chain]))
		}
	}
	return b.String()
}

func xtFamily(f servicelb.Family) xtables.Family { return ruleNames{f: f}.family() }

// planText renders what a plan holds: its fake kernel, the counts of the set
// entries, the owners of the virtual servers and the marks.
func planText(p *model) string {
	var b strings.Builder
	b.WriteString(fakeKernelOf(p).text())
	for _, e := range slices.SortedFunc(maps.Keys(p.entries), compareEntries) {
		fmt.Fprintf(&b, "count %s-%s %s %d\n", e.set, e.family, e, p.entries[e])
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.owner), compareKeys) {
		fmt.Fprintf(&b, "owner %s %s\n", k, p.owner[k])
	}
	for _, u := range slices.SortedFunc(maps.Keys(p.units), compareUnits) {
		fmt.Fprintf(&b, "mark %s %#x of %s\n", u, p.marks[u], p.units[u])
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.ports), servicelb.ServicePortKey.Compare) {
		if p.ports[k].key() != k {
			fmt.Fprintf(&b, "port %s planned as %s\n", k, p.ports[k].key())
		}
	}
	return b.String()
}

// TestIncrementalPlanEqualsFresh walks random states as a Runner makes
// them, one Builder's changes in a row, and checks after each step that
// the plan the steps leave and the kernel the deltas leave both equal a
// fresh plan of the step's state: virtual servers, set entries, steers,
// marks. A small mark space makes marks collide, move and run out.
func TestIncrementalPlanEqualsFresh(t *testing.T) {
	for _, tc := range []struct {
		name string
		mask uint32
	}{{"default marks", 0}, {"fifteen marks", 0x000f0000}, {"three marks", 0x00030000}} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Options{FWMarkMask: tc.mask}.withDefaults()
			require.NoError(t, err)
			var steps, refused, steered, moved int
			seeds := uint64(12)
			if testing.Short() {
				seeds = 2 // in the VM, whose emulation is slow: the host runs all
			}
			for seed := range seeds {
				w := walkPlans(t, randomStates(seed), &o, 100)
				steps, refused, steered, moved = steps+w.steps, refused+w.refused, steered+w.steered, moved+w.moved
			}
			t.Logf("%d incremental steps, %d refused, %d with steers, %d moved marks", steps, refused, steered, moved)
			require.Positive(t, steered, "no step had a steered port")
		})
	}
}

// FuzzPlans walks the changes of TestIncrementalPlanEqualsFresh with
// every random choice drawn from the fuzzer's bytes, in a mark space of
// three marks, and renders each state as Render does.
func FuzzPlans(f *testing.F) {
	for _, seed := range []string{"", "ipvs", "\x00\x01\x02\x03\x04\x05\x06\x07\x08", "a longer seed that steers more of the walk"} {
		f.Add([]byte(seed))
	}
	o, err := Options{FWMarkMask: 0x00030000}.withDefaults()
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, data []byte) {
		walkPlans(t, servicetest.New(randomOptions(servicetest.Options{Source: servicetest.Source(data)})), &o, 40)
	})
}

// randomOptions are the options of the random states of the proxier's
// tests: every scheduler hint, "random" among them, which IPVS refuses.
func randomOptions(o servicetest.Options) servicetest.Options {
	o.Schedulers = servicelb.Schedulers()
	return o
}

func randomStates(seed uint64) *servicetest.Gen {
	return servicetest.New(randomOptions(servicetest.Options{Seed: seed}))
}

type walkStats struct{ steps, refused, steered, moved int }

// walkPlans walks n random changes of g through a plan and a fake kernel.
func walkPlans(t *testing.T, g *servicetest.Gen, o *Options, n int) walkStats {
	t.Helper()
	var w walkStats
	b, err := servicelb.NewBuilder(g.Node())
	require.NoError(t, err)
	applied := b.State()
	plan, err := buildModel(applied, o)
	require.NoError(t, err)
	m := fakeKernelOf(plan)
	for i := range n {
		_, err := g.Step(b)
		require.NoError(t, err, "step %d", i)
		next := b.State()
		fresh, ferr := buildModel(next, o)
		ch := servicelb.Diff(applied, next)
		if ch.NodeChanged {
			if ferr == nil {
				applied, plan, m = next, fresh, fakeKernelOf(fresh)
			}
			continue
		}
		s, err := plan.plan(&ch)
		require.Equal(t, ferr == nil, err == nil, "step %d: incremental error %v, fresh error %v", i, err, ferr)
		if err != nil {
			w.refused++
			continue
		}
		m.apply(plan.delta(s))
		if s.units != nil {
			w.moved += len(s.put) - len(ch.Added) - len(ch.Changed)
		}
		plan.commit(s)
		applied = next
		w.steps++
		if len(plan.units) > 0 {
			w.steered++
		}
		want := planText(fresh)
		require.Equal(t, want, planText(plan), "step %d: plan after the steps differs from a fresh plan", i)
		text, err := Render(next, *o)
		require.NoError(t, err, "step %d: Render", i)
		require.Contains(t, text, SectionIPVS, "step %d: Render", i)
		require.Equal(t, fakeKernelOf(fresh).text(), m.text(), "step %d: kernel after the deltas differs from a fresh plan's", i)
	}
	return w
}
