//go:build privileged || vm

package nftables_test

import (
	"flag"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
)

var randomSeed = flag.Uint64("nftables.seed", 0, "seed of TestRandomTransitions; 0 picks one")

// TestRandomTransitions applies 300 random changes, one sync each, then
// checks that the table equals what a fresh proxier writes for the final
// state.
func TestRandomTransitions(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	seed := *randomSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nftables.seed %d)", seed, seed)
	w := servicetest.New(nftables.RandomOptions(servicetest.Options{Seed: seed, Services: 60}))
	b, err := w.Start()
	if err != nil {
		t.Fatal(err)
	}
	h, fresh := netnstest.NewHost(t, "history"), netnstest.NewHost(t, "fresh")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	mustSync(t, p, b.State())
	kinds := map[string]int{}
	seen, gone := map[string]bool{}, map[string]bool{}
	steps := 300
	if testing.Short() {
		steps = 100 // in the VM, whose emulation is slow: the host runs all
	}
	for i := range steps {
		kind, err := w.Step(b)
		if err != nil {
			t.Fatalf("change %d (%s): %v", i, kind, err)
		}
		kinds[kind]++
		if err := servicetest.SyncErr(p.Sync(testCtx(t), b.State())); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		if d := nftables.ModelDrift(p, b.State()); d != "" {
			t.Fatalf("after change %d (%s): %s", i, kind, d)
		}
		now := nftables.SharedSets(p)
		for name := range seen {
			if !slices.Contains(now, name) {
				gone[name] = true
			}
		}
		for _, name := range now {
			seen[name] = true
		}
	}
	t.Logf("changes: %v; %d services at the end", kinds, b.Len())
	q := newProxier(t, fresh, nftables.Options{NoConntrackCleanup: true})
	mustSync(t, q, b.State())
	if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
		t.Errorf("table after 300 changes differs from a fresh apply of the final state (-fresh +history):\n%s", diff)
	}
	if len(gone) == 0 {
		t.Errorf("no shape or bucket set ever went (of %d): the test did not cover the shared chains changing", len(seen))
	}
}
