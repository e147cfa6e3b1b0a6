package servicelb

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// refDiff computes the changes between two States from their full port
// lists, independently of how Diff finds them.
func refDiff(from, to *State) (added, removed, changed []string) {
	old := map[ServicePortKey]*ServicePort{}
	for _, p := range from.Ports() {
		old[p.Key] = p
	}
	for _, p := range to.Ports() {
		o, ok := old[p.Key]
		switch {
		case !ok:
			added = append(added, p.Key.String())
		case !o.Equal(p):
			changed = append(changed, p.Key.String())
		}
		delete(old, p.Key)
	}
	for k := range old {
		removed = append(removed, k.String())
	}
	slices.Sort(removed)
	return append([]string{}, added...), append([]string{}, removed...), append([]string{}, changed...)
}

// TestBuilderSnapshotsAgainstReference applies random upserts and deletes,
// taking States at random points, and checks every State's contents and
// the Diff between consecutive States against a full comparison; then
// Diff between States far apart.
func TestBuilderSnapshotsAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b, err := NewBuilder(NodeConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Service{}
	svcFor := func(i, gen int) Service {
		return simple(fmt.Sprintf("s%03d", i), fmt.Sprintf("10.96.%d.%d", i/200, i%200+1), fmt.Sprintf("10.0.%d.%d", gen%200, i%200+1))
	}
	for i := range 300 {
		want[svcFor(i, 0).Name] = svcFor(i, 0)
		if err := b.Upsert(svcFor(i, 0)); err != nil {
			t.Fatal(err)
		}
	}
	states := []*State{b.State()}
	for step := range 3000 {
		i := rng.IntN(400)
		name := fmt.Sprintf("s%03d", i)
		if rng.IntN(4) == 0 {
			if b.Delete(name) != (want[name].Name != "") {
				t.Fatalf("step %d: Delete(%s) disagrees with the reference", step, name)
			}
			delete(want, name)
		} else {
			s := svcFor(i, step)
			if err := b.Upsert(s); err != nil {
				t.Fatal(err)
			}
			want[name] = s
		}
		if rng.IntN(3) > 0 {
			continue
		}
		prev, cur := states[len(states)-1], b.State()
		states = append(states, cur)
		checkContents(t, cur, want)
		checkDiff(t, prev, cur)
		checkDiff(t, cur, prev)
	}
	for range 50 {
		x, y := states[rng.IntN(len(states))], states[rng.IntN(len(states))]
		checkDiff(t, x, y)
	}
	// A Builder made by Edit shares the State's maps and must not write
	// into them.
	first := states[0]
	before := first.Ports()
	ed := first.Edit()
	for i := range 200 {
		ed.Delete(fmt.Sprintf("s%03d", i))
	}
	if err := ed.Upsert(svcFor(1, 99)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(keys(before), keys(first.Ports())) || first.Len() != 300 {
		t.Fatal("editing a State's Builder changed the State")
	}
	checkDiff(t, first, ed.State())
}

func checkContents(t *testing.T, st *State, want map[string]Service) {
	t.Helper()
	if st.Len() != len(want) {
		t.Fatalf("state has %d services, want %d", st.Len(), len(want))
	}
	for _, s := range st.Services() {
		w, ok := want[s.Name]
		if !ok || !reflect.DeepEqual(s.Endpoints, w.Endpoints) {
			t.Fatalf("state's %s differs from the reference", s.Name)
		}
	}
}

func checkDiff(t *testing.T, from, to *State) {
	t.Helper()
	c := Diff(from, to)
	a, r, ch := refDiff(from, to)
	if !slices.Equal(keys(c.Added), a) || !slices.Equal(keys(c.Removed), r) || !slices.Equal(changedKeys(c.Changed), ch) {
		t.Fatalf("Diff: added %v removed %v changed %v; want %v %v %v",
			keys(c.Added), keys(c.Removed), changedKeys(c.Changed), a, r, ch)
	}
}

// TestDiffOfConsecutiveStatesReadsOnlyChanges: with many services, Diff of
// two States one change apart looks at the services of the one branch of
// the index the change made again (a few, not all of them), and Diff of a
// State and its Without at those of the names left out.
func TestDiffOfConsecutiveStatesReadsOnlyChanges(t *testing.T) {
	b, _ := NewBuilder(NodeConfig{})
	for i := range 5000 {
		if err := b.Upsert(simple(fmt.Sprintf("s%04d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	prev := b.State()
	same := func(a, b *entry) bool { return a == b }
	for i := range 1000 {
		if err := b.Upsert(simple(fmt.Sprintf("s%04d", i), fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), "10.0.0.2")); err != nil {
			t.Fatal(err)
		}
		cur := b.State()
		var changed []string
		seen := prev.svcs.diff(&cur.svcs.pmap, same, func(name string, _, _ *entry, _, _ bool) { changed = append(changed, name) })
		if want := []string{fmt.Sprintf("s%04d", i)}; !slices.Equal(changed, want) || seen > 64 {
			t.Fatalf("change %d: Diff found %v, want %v, looking at %d services", i, changed, want, seen)
		}
		if c := Diff(prev, cur); len(c.Changed) != 2 || len(c.Added)+len(c.Removed) != 0 {
			t.Fatalf("change %d: %+v", i, c)
		}
		prev = cur
	}
	w := prev.Without("s0001", "s4999")
	seen := prev.svcs.diff(&w.svcs.pmap, same, func(string, *entry, *entry, bool, bool) {})
	if c := Diff(prev, w); len(c.Removed) != 4 || len(c.Added)+len(c.Changed) != 0 || seen > 128 {
		t.Fatalf("Without: %+v, looking at %d services", c, seen)
	}
}

// TestForkedBuildersKeepTheirChanges: two Builders that go on from one
// State (its own and one from Edit) each record their own changes; Diff
// of the State and either one's next State finds exactly that Builder's
// change, and Diff between the two, both.
func TestForkedBuildersKeepTheirChanges(t *testing.T) {
	b, _ := NewBuilder(NodeConfig{})
	for i := range 50 {
		if err := b.Upsert(simple(fmt.Sprintf("s%02d", i), fmt.Sprintf("10.96.0.%d", i+1), "10.0.0.1")); err != nil {
			t.Fatal(err)
		}
	}
	b.State()
	// A few changes, so that the State's names have room past them.
	for i := range 3 {
		if err := b.Upsert(simple(fmt.Sprintf("s%02d", i), fmt.Sprintf("10.96.0.%d", i+1), "10.0.0.2")); err != nil {
			t.Fatal(err)
		}
	}
	s := b.State()
	e := s.Edit()
	if err := b.Upsert(simple("s10", "10.96.0.11", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if err := e.Upsert(simple("s20", "10.96.0.21", "10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	bs, es := b.State(), e.State()
	for _, c := range []struct {
		from, to *State
		want     []string
	}{{s, bs, []string{"s10"}}, {s, es, []string{"s20"}}, {bs, es, []string{"s10", "s20"}}} {
		var got []string
		for _, pc := range Diff(c.from, c.to).Changed {
			got = append(got, pc.New.Key.Service)
		}
		got = slices.Compact(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("Diff found changes to %v, want %v", got, c.want)
		}
		checkDiff(t, c.from, c.to)
	}
}

// BenchmarkChangeAndDiff is the work of one endpoint change with n
// services, by each path: a Runner's (an upsert into the Builder it keeps,
// a State, and its Diff from the State before), an editor's (the last
// State edited, the upsert, a State and its Diff from the one edited), and
// a caller's that hands over the whole next state (NewState of every
// service, one of them changed, and its Diff from the last: it shares
// nothing with the last, so both cost O(n)). diff-ns/op is the Diff's
// share.
func BenchmarkChangeAndDiff(b *testing.B) {
	svc := func(i, gen int) Service {
		return simple(fmt.Sprintf("s%05d", i), fmt.Sprintf("10.%d.%d.%d", 96+i/62500, i/250%250, i%250+1), fmt.Sprintf("10.0.%d.1", gen%2+1))
	}
	for _, n := range []int{1000, 10000, 50000} {
		bl, _ := NewBuilder(NodeConfig{})
		for i := range n {
			if err := bl.Upsert(svc(i, 0)); err != nil {
				b.Fatal(err)
			}
		}
		start := bl.State()
		for _, path := range []string{"builder", "edit", "newstate"} {
			b.Run(fmt.Sprintf("%s/%d", path, n), func(b *testing.B) {
				prev, bl := start, start.Edit()
				var all []Service
				if path == "newstate" {
					for i := range n {
						all = append(all, svc(i, 0))
					}
				}
				var diff time.Duration
				b.ResetTimer()
				for i := range b.N {
					var cur *State
					switch path {
					case "newstate":
						all[i%n] = svc(i%n, i/n+1)
						var err error
						if cur, err = NewState(NodeConfig{}, all...); err != nil {
							b.Fatal(err)
						}
					case "edit":
						bl = prev.Edit()
						fallthrough
					default:
						if err := bl.Upsert(svc(i%n, i/n+1)); err != nil {
							b.Fatal(err)
						}
						cur = bl.State()
					}
					t0 := time.Now()
					c := Diff(prev, cur)
					diff += time.Since(t0)
					if c.Len() != 2 {
						b.Fatalf("%d changes", c.Len())
					}
					prev = cur
				}
				b.ReportMetric(float64(diff.Nanoseconds())/float64(b.N), "diff-ns/op")
			})
		}
	}
}
