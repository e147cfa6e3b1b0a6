package servicetest

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestWalkCoversTheServicePort: a walk of a few hundred states reaches
// every shape the property tests need: each verdict, both families,
// source ranges, affinity, health check ports, clashes, node changes.
func TestWalkCoversTheServicePort(t *testing.T) {
	states, err := New(Options{Seed: 1, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}}).Walk(400)
	require.NoError(t, err)
	require.Len(t, states, 400)
	seen := map[string]bool{}
	for i, st := range states {
		if len(st.Conflicts()) > 0 {
			seen["conflict"] = true
		}
		if i > 0 {
			if c := servicelb.Diff(states[i-1], st); c.NodeChanged {
				seen["node change"] = true
			}
		}
		for _, sp := range st.Ports() {
			seen[sp.Family.String()] = true
			seen[sp.Port.Protocol.Lower()] = true
			for _, vs := range []servicelb.Verdicts{sp.Internal, sp.External} {
				for _, o := range servicelb.Origins() {
					seen[vs.Of(o).String()] = true
				}
			}
			if len(sp.SourceRanges) > 0 {
				seen["ranges"] = true
			}
			if sp.Affinity > 0 {
				seen["affinity"] = true
			}
			if sp.HealthCheckNodePort > 0 {
				seen["health"] = true
			}
			if sp.Scheduler != "" {
				seen["scheduler"] = true
			}
			if len(sp.NodeIPs) > 0 {
				seen["node port"] = true
			}
		}
	}
	for _, want := range []string{"conflict", "node change", "ipv4", "ipv6", "tcp", "udp", "sctp", "reject", "drop",
		"cluster", "cluster+masq", "local", "local+masq", "ranges", "affinity", "health", "scheduler", "node port"} {
		assert.True(t, seen[want], "no %s in the walk", want)
	}
}

// TestSource: the same data gives the same numbers, the data's own bytes
// first; once they run out the numbers go on varying (a rejection
// sampler such as IntN(3) must end).
func TestSource(t *testing.T) {
	data := []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 3}
	a, b := Source(data), Source(data)
	require.Equal(t, uint64(1), a.Uint64())
	require.Equal(t, uint64(1), b.Uint64())
	require.Equal(t, uint64(0x0302), a.Uint64())
	require.Equal(t, uint64(0x0302), b.Uint64())
	seen := map[uint64]bool{}
	for range 16 {
		x := a.Uint64()
		require.Equal(t, x, b.Uint64())
		seen[x] = true
	}
	require.Greater(t, len(seen), 8, "numbers after the data do not vary")
	r := rand.New(Source(nil))
	for range 100 {
		r.IntN(3)
	}
}
