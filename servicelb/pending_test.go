package servicelb

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPendingRestoreLosesNothing: whatever is pending when a sync takes it
// and whatever changes while that sync runs and fails, the pending changes
// once it is restored are those that would be pending had the sync never
// run: the same services with the same kinds and counts, the same causes,
// the node's change, and the oldest queue times.
func TestPendingRestoreLosesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	t0 := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for round := range 300 {
		now := t0
		var ops []func(*pending)
		n := 1 + rng.IntN(12)
		for range n {
			name := fmt.Sprintf("ns/svc%d", rng.IntN(5))
			k := changeKind(1 + rng.IntN(3))
			fams := familySet(1 + rng.IntN(3))
			at, cause := now, now.Add(-time.Duration(rng.IntN(3))*time.Second)
			node := rng.IntN(6) == 0
			ops = append(ops, func(p *pending) {
				p.mark(name, k)
				p.addTrigger(name, trigger{at: cause, fams: fams})
				p.queue(at, fams)
				p.node = p.node || node
			})
			now = now.Add(time.Duration(1+rng.IntN(3)) * time.Second)
		}
		cut := rng.IntN(n + 1)

		never := newPending()
		for _, op := range ops {
			op(&never)
		}
		p := newPending()
		for _, op := range ops[:cut] {
			op(&p)
		}
		taken := p.take()
		if !p.empty() || p.queuedAt != (time.Time{}) {
			t.Fatalf("round %d: take left %+v", round, p)
		}
		for _, op := range ops[cut:] {
			op(&p)
		}
		p.restore(taken)

		sortTriggers := cmp.Transformer("sorted", func(ts []trigger) []trigger {
			out := slices.Clone(ts)
			slices.SortFunc(out, func(a, b trigger) int { return a.at.Compare(b.at) })
			return out
		})
		if d := cmp.Diff(never, p, cmp.AllowUnexported(pending{}, trigger{}), sortTriggers); d != "" {
			t.Fatalf("round %d (taken after %d of %d changes): restored pending differs from never taken (-never +restored):\n%s", round, cut, n, d)
		}
	}
}
