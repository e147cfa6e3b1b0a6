//go:build linux

package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestRandomPlans walks random sequences of states and checks after each
// step that the tables as the incremental path leaves them (a full
// content on the first state and on node changes, as Sync reconciles
// then, and each Diff's changes applied to it otherwise) equal the fresh
// content of the state. A state with a port the Proxier's capabilities
// refuse must fail both ways, recording nothing, and is taken back.
func TestRandomPlans(t *testing.T) {
	seed := rand.Uint64()
	if s, err := strconv.ParseUint(os.Getenv("KPROXY_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d", seed)
	cov := map[string]int{}
	runs := 4
	if testing.Short() {
		runs = 1 // in the VM, whose emulation is slow: the host runs all
	}
	for run := range runs {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			randomPlans(t, servicetest.New(randomOptions(servicetest.Options{Seed: seed + uint64(run)})), 600, cov)
			if t.Failed() {
				t.Logf("reproduce with KPROXY_TEST_SEED=%d", seed)
			}
		})
	}
	t.Logf("coverage: %v", cov)
	for _, shape := range []string{"reject", "drop", "pod short-circuit", "node in source ranges", "IPv6 source ranges",
		"node port on some node addresses", "node port on localhost", "health check", "affinity", "weights", "refused"} {
		require.Positive(t, cov[shape], "shape %q never generated", shape)
	}
}

// FuzzPlans runs the steps of TestRandomPlans with every random choice
// drawn from the fuzzer's bytes, and renders each state as Render does.
func FuzzPlans(f *testing.F) {
	for _, seed := range []string{"", "iptables", "\x00\x01\x02\x03\x04\x05\x06\x07\x08", "a longer seed that steers more of the walk"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		randomPlans(t, servicetest.New(randomOptions(servicetest.Options{Source: servicetest.Source(data)})), 60, map[string]int{})
	})
}

// randomOptions are the options of the random states of the rules'
// tests: a dozen services, node ports on localhost (which these rules
// alone serve), the random scheduler and one the rules refuse ("rr").
func randomOptions(o servicetest.Options) servicetest.Options {
	o.Services = 12
	o.Schedulers = []servicelb.Scheduler{servicelb.SchedulerRandom, servicelb.SchedulerRoundRobin}
	o.LocalhostNodePorts = true
	return o
}

// randomPlans runs one sequence of steps, counting in cov the shapes of
// the ports it plans. A change the Proxier's capabilities refuse is taken
// back.
func randomPlans(t *testing.T, g *servicetest.Gen, steps int, cov map[string]int) {
	px := newOffline(t, Options{})
	b, err := servicelb.NewBuilder(g.Node())
	require.NoError(t, err)
	prev := b.State()
	fresh, err := px.content(prev)
	require.NoError(t, err)
	model := tableModel(fresh)
	for step := range steps {
		kind, err := g.Step(b)
		require.NoError(t, err, "step %d (%s)", step, kind)
		st := b.State()
		ch := servicelb.Diff(prev, st)
		want, wantErr := px.content(st)
		if ch.NodeChanged {
			require.NoError(t, wantErr, "step %d: node change", step)
			model = want
		} else {
			var rec txRecorder
			err := px.changes(st, &ch, &rec)
			if err != nil || wantErr != nil {
				require.ErrorIs(t, err, servicelb.ErrUnsupported, "step %d: incremental", step)
				require.ErrorIs(t, wantErr, servicelb.ErrUnsupported, "step %d: fresh", step)
				require.Empty(t, rec, "step %d: a refused change recorded changes", step)
				cov["refused"]++
				b = prev.Edit()
				continue
			}
			model = model.clone()
			rec.apply(model)
		}
		if diff := cmp.Diff(tableModel(want).lines(), model.lines()); diff != "" {
			t.Fatalf("step %d (%s): incremental content differs from a fresh one (-fresh +incremental):\n%s", step, kind, diff)
		}
		for _, c := range model.chains() {
			require.True(t, px.n.owns(c), "step %d: chain %s not owned", step, c)
		}
		text, err := px.Render(st)
		require.NoError(t, err, "step %d: Render", step)
		require.Contains(t, text, "COMMIT", "step %d: Render", step)
		covered(cov, &ch, st)
		prev = st
	}
}

// covered counts the shapes of the ports a change added or changed.
func covered(cov map[string]int, ch *servicelb.Changes, st *servicelb.State) {
	ports := slices.Clone(ch.Added)
	for _, c := range ch.Changed {
		ports = append(ports, c.New)
	}
	node := st.Node()
	for _, sp := range ports {
		vs := append(sp.Internal[:], sp.External[:]...)
		for _, shape := range []struct {
			name string
			ok   bool
		}{
			{"reject", slices.ContainsFunc(vs, func(v servicelb.Verdict) bool { return v.Action == servicelb.Reject })},
			{"drop", slices.ContainsFunc(vs, func(v servicelb.Verdict) bool { return v.Action == servicelb.Drop })},
			{"pod short-circuit", sp.External[servicelb.FromPod] != sp.External[servicelb.FromOutside]},
			{"node in source ranges", slices.ContainsFunc(sp.SourceRanges, netip.Prefix.IsSingleIP)},
			{"IPv6 source ranges", len(sp.SourceRanges) > 0 && sp.Family == servicelb.IPv6},
			{"node port on some node addresses", len(sp.NodeIPs) > 0 && len(sp.NodeIPs) < len(node.NodePortIPs(sp.Family))},
			{"node port on localhost", slices.Contains(sp.NodeIPs, netip.AddrFrom4([4]byte{127, 0, 0, 1}))},
			{"health check", sp.HealthCheckNodePort != 0},
			{"affinity", sp.Affinity > 0},
			{"weights", slices.ContainsFunc(sp.Cluster, func(b servicelb.Backend) bool { return b.Weight != 1 })},
		} {
			if shape.ok {
				cov[shape.name]++
			}
		}
	}
}
