package servicelb

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWithoutLeavesTheRestAsItIs: a State without some services holds
// every other service as compiled, its frontends included: a frontend a
// service left out holds is not handed to the service that asks for it
// too. The State it was made from does not change, and names it lacks
// change nothing.
func TestWithoutLeavesTheRestAsItIs(t *testing.T) {
	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	require.NoError(t, b.Upsert(simple("ns/a", "10.0.0.1", "10.1.0.1")))
	require.NoError(t, b.Upsert(simple("ns/b", "10.0.0.2", "10.1.0.2")))
	require.NoError(t, b.Upsert(simple("ns/c", "10.0.0.1", "10.1.0.3"))) // asks for a's frontend
	st := b.State()
	require.Len(t, st.Conflicts(), 2, "c asks for both of a's frontends")

	w := st.Without("ns/a", "ns/missing")
	assert.Equal(t, 2, w.Len())
	_, has := w.Service("ns/a")
	assert.False(t, has)
	assert.Equal(t, st.ServicePorts("ns/c"), w.ServicePorts("ns/c"), "c's ports were compiled again")
	for _, sp := range w.ServicePorts("ns/c") {
		assert.Empty(t, sp.Frontends(), "c was handed the frontend of the service left out")
	}
	assert.Equal(t, 3, st.Len(), "the State Without was called on changed")
	assert.Same(t, st, st.Without("ns/missing"), "a State without none of its services is not the same State")
	assert.Same(t, st, st.Without(), "a State without nothing is not the same State")

	ch := Diff(st, w)
	assert.Equal(t, []string{"ns/a:tcp/ipv4", "ns/a:udp/ipv4"}, keys(ch.Removed))
	assert.Empty(t, ch.Added)
	assert.Empty(t, ch.Changed)
}

// TestWithoutDiffs: Diff of two States without some services, each made
// from one Builder's States as a proxier leaving services out makes them,
// reports what a comparison of their ports in full does, across changes,
// deletions, compactions of the Builder's map and changes of the
// services left out.
func TestWithoutDiffs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	const n = 60
	name := func(i int) string { return fmt.Sprintf("ns/s%d", i) }
	upsert := func(i, gen int) {
		require.NoError(t, b.Upsert(simple(name(i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), fmt.Sprintf("10.1.%d.%d", gen%200, i%250+1))))
	}
	for i := range n {
		upsert(i, 0)
	}
	var prev *State
	for step := range 400 {
		for range 1 + r.IntN(3) {
			if i := r.IntN(n); r.IntN(5) == 0 {
				b.Delete(name(i))
			} else {
				upsert(i, step)
			}
		}
		var out []string
		for range r.IntN(3) {
			out = append(out, name(r.IntN(n)))
		}
		cur := b.State().Without(out...)
		for _, o := range out {
			_, has := cur.Service(o)
			require.False(t, has, "step %d: %s left out is there", step, o)
		}
		require.Equal(t, len(cur.Services()), cur.Len(), "step %d", step)
		if prev != nil {
			got, want := Diff(prev, cur), fullDiff(prev, cur)
			require.Equal(t, want.added, keys(got.Added), "step %d: added", step)
			require.Equal(t, want.removed, keys(got.Removed), "step %d: removed", step)
			for _, k := range want.changed {
				require.Contains(t, changedKeys(got.Changed), k, "step %d: changed", step)
			}
		}
		prev = cur
	}
}

type portDiff struct{ added, removed, changed []string }

// fullDiff compares the ports of two States one by one.
func fullDiff(from, to *State) portDiff {
	d := portDiff{added: []string{}, removed: []string{}}
	old := map[ServicePortKey]*ServicePort{}
	for _, sp := range from.Ports() {
		old[sp.Key] = sp
	}
	for _, sp := range to.Ports() {
		o, ok := old[sp.Key]
		switch {
		case !ok:
			d.added = append(d.added, sp.Key.String())
		case !reflect.DeepEqual(o, sp):
			d.changed = append(d.changed, sp.Key.String())
		}
		delete(old, sp.Key)
	}
	for _, k := range slices.SortedFunc(maps.Keys(old), ServicePortKey.Compare) {
		d.removed = append(d.removed, k.String())
	}
	return d
}
