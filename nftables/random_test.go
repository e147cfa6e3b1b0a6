//go:build linux

package nftables

import (
	"flag"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var planSeed = flag.Uint64("nftables.planseed", 0, "seed of TestRandomPlans; 0 picks one")

// TestRandomPlans walks random sequences of states and, after each change,
// checks the planner's incremental path against a fresh one: the model
// after the step equals the model a fresh build of the new state gives,
// and the step's delta, replayed on the table of the old model, gives the
// table of the fresh one (every deletion finds what it deletes, every
// reference finds what it refers to).
func TestRandomPlans(t *testing.T) {
	seed := *planSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nftables.planseed %d)", seed, seed)
	requireDistinctSlots(t, randomStates(seed))
	kinds := map[string]int{}
	rounds := uint64(4)
	if testing.Short() {
		rounds = 1 // in the VM, whose emulation is slow: the host runs all
	}
	for round := range rounds {
		walkPlans(t, randomStates(seed+round), 300, kinds)
	}
	t.Logf("changes: %v", kinds)
}

// FuzzPlans walks states drawn from the fuzzer's bytes and checks every
// step as TestRandomPlans does, rendering each model as Render does.
func FuzzPlans(f *testing.F) {
	for _, seed := range []string{"", "nftables", "\x00\x01\x02\x03\x04\x05\x06\x07\x08", "a longer seed that steers more of the walk"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		walkPlans(t, servicetest.New(randomOptions(servicetest.Options{Source: servicetest.Source(data)})), 40, map[string]int{})
	})
}

// randomOptions are the options of the random states of the table's
// tests, from o's seed or source: the services of a pool of 40 (60 for
// the kernel's test), the schedulers the table honours.
func randomOptions(o servicetest.Options) servicetest.Options {
	if o.Services == 0 {
		o.Services = 40
	}
	o.Schedulers = []servicelb.Scheduler{servicelb.SchedulerRandom}
	return o
}

func randomStates(seed uint64) *servicetest.Gen {
	return servicetest.New(randomOptions(servicetest.Options{Seed: seed}))
}

// walkPlans walks steps changes of g from a Builder holding half its
// services, and checks each step (checkStep), rendering each model as
// Render does; kinds counts the changes by kind.
func walkPlans(t *testing.T, g *servicetest.Gen, steps int, kinds map[string]int) {
	t.Helper()
	b, err := g.Start()
	require.NoError(t, err)
	p := newPlanner("kproxy", DefaultAffinitySize)
	st := b.State()
	m, err := p.build(st)
	require.NoError(t, err)
	for i := range steps {
		kind, err := g.Step(b)
		require.NoError(t, err, "change %d (%s)", i, kind)
		kinds[kind]++
		next := b.State()
		if err := checkStep(p, m, st, next); err != nil {
			t.Fatalf("change %d (%s): %v", i, kind, err)
		}
		// m is next's model now: its text renders (Render's path).
		require.Contains(t, p.content(m).render("kproxy"), "table inet kproxy", "change %d (%s): render", i, kind)
		st = next
	}
}

// requireDistinctSlots checks that no two load-balancing chains of the
// generator's services have the same home slot: then a model and a fresh
// build give every chain the same slot, whatever the order the chains
// came in.
func requireDistinctSlots(t *testing.T, g *servicetest.Gen) {
	seen := map[[2]uint32]slotKey{}
	for i := range g.Services() {
		for j := range 3 {
			for _, f := range families {
				for _, local := range []bool{false, true} {
					k := slotKey{port: servicelb.ServicePortKey{Service: g.Name(i), Port: fmt.Sprintf("p%d", j), Family: f}, local: local}
					h := [2]uint32{uint32(famIndex(f)), k.home()}
					o, clash := seen[h]
					require.False(t, clash, "%v and %v share a home slot", o, k)
					seen[h] = k
				}
			}
		}
	}
}

// checkStep plans the change from st (whose model is m) to next, applies
// it to m and compares m and its table with a fresh build of next.
func checkStep(p *planner, m *model, st, next *servicelb.State) error {
	ch := servicelb.Diff(st, next)
	s, err := p.plan(m, &ch, next)
	if err != nil {
		return err
	}
	table := fakeOf(p.content(m))
	if err := table.apply(s.delta(m)); err != nil {
		return fmt.Errorf("delta: %w", err)
	}
	s.apply(m)
	fresh, err := p.build(next)
	if err != nil {
		return err
	}
	if d := modelDrift(p, m, fresh); d != "" {
		return fmt.Errorf("model drifted: %s", d)
	}
	if want := fakeOf(p.content(fresh)); !reflect.DeepEqual(want, table) {
		d := cmp.Diff(want, table, cmp.AllowUnexported(fakeTable{}, elem{}))
		return fmt.Errorf("table after the delta differs from a fresh one (-fresh +delta):\n%s", d)
	}
	return table.check()
}

// fakeTable is a table as the kernel holds it, for replaying deltas: its
// sets' elements by id, and its chains' rules as text.
type fakeTable struct {
	sets   map[string]map[string]elem
	chains map[string][]string
}

func fakeOf(c *content) *fakeTable {
	ft := &fakeTable{sets: map[string]map[string]elem{}, chains: map[string][]string{}}
	for _, d := range c.sets {
		es := map[string]elem{}
		for _, e := range c.setElems(d.id) {
			es[e.id()] = e
		}
		ft.sets[d.set.Name] = es
	}
	for _, ch := range c.chains {
		for _, r := range ch.rules {
			ft.chains[ch.name] = append(ft.chains[ch.name], r.text)
		}
		if ft.chains[ch.name] == nil {
			ft.chains[ch.name] = []string{}
		}
	}
	return ft
}

// apply replays a delta in the order its batch sends it, failing where
// the kernel would.
func (ft *fakeTable) apply(d *delta) error {
	for _, set := range slices.Sorted(maps.Keys(d.delElems)) {
		for _, e := range d.delElems[set] {
			if _, ok := ft.sets[set.name()][e.id()]; !ok {
				return fmt.Errorf("delete of a missing element of %s: %v", set.name(), elemTexts(set, []elem{e}))
			}
			delete(ft.sets[set.name()], e.id())
		}
	}
	for _, c := range d.flush {
		if _, ok := ft.chains[c]; !ok {
			return fmt.Errorf("flush of missing chain %s", c)
		}
		ft.chains[c] = []string{}
	}
	for _, c := range d.delete {
		if rs, ok := ft.chains[c]; !ok || len(rs) > 0 {
			return fmt.Errorf("delete of missing or non-empty chain %s", c)
		}
		delete(ft.chains, c)
	}
	for _, s := range d.delSets {
		if _, ok := ft.sets[s.name()]; !ok {
			return fmt.Errorf("delete of missing set %s", s.name())
		}
		delete(ft.sets, s.name())
	}
	for _, s := range d.addSets {
		if ft.sets[s.name()] == nil {
			ft.sets[s.name()] = map[string]elem{}
		}
	}
	return ft.add(d)
}

// add replays the creating half of a delta.
func (ft *fakeTable) add(d *delta) error {
	for _, c := range d.create {
		if _, ok := ft.chains[c.name]; ok {
			return fmt.Errorf("create of existing chain %s", c.name)
		}
		ft.chains[c.name] = []string{}
	}
	for _, c := range d.write {
		if rs, ok := ft.chains[c.name]; !ok || len(rs) > 0 {
			return fmt.Errorf("rules written into missing or non-empty chain %s", c.name)
		}
		for _, r := range c.rules {
			ft.chains[c.name] = append(ft.chains[c.name], r.text)
		}
	}
	for _, set := range slices.Sorted(maps.Keys(d.addElems)) {
		es, ok := ft.sets[set.name()]
		if !ok && len(d.addElems[set]) > 0 {
			return fmt.Errorf("elements added to missing set %s", set.name())
		}
		for _, e := range d.addElems[set] {
			if o, ok := es[e.id()]; ok && !o.same(&e) {
				return fmt.Errorf("element of %s added over one with other data", set.name())
			}
			es[e.id()] = e
		}
	}
	return nil
}

// check finds references to chains and sets the table lacks.
func (ft *fakeTable) check() error {
	for name, es := range ft.sets {
		for _, e := range es {
			if _, ok := ft.chains[e.chain]; e.chain != "" && !ok {
				return fmt.Errorf("%s refers to missing chain %s", name, e.chain)
			}
		}
	}
	for name, rs := range ft.chains {
		for _, r := range rs {
			words := strings.Fields(r)
			for i, w := range words {
				if (w == "jump" || w == "goto") && i+1 < len(words) {
					if _, ok := ft.chains[words[i+1]]; !ok {
						return fmt.Errorf("chain %s: %q refers to missing chain", name, r)
					}
				}
				if ref, ok := strings.CutPrefix(w, "@"); ok {
					if _, ok := ft.sets[ref]; !ok {
						return fmt.Errorf("chain %s: %q refers to missing set", name, r)
					}
				}
			}
		}
	}
	return nil
}
