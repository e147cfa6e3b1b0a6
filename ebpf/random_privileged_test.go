//go:build privileged

package ebpf_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kebpf "github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/internal/netnstest"
	"github.com/kproxy-dev/kproxy/internal/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// records keeps the messages of log records.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) has(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, s) {
			return true
		}
	}
	return false
}

// TestRandomWalkMatchesAFreshWrite syncs random walks of states into the
// maps, one change at a time; at the end the deep verify of an unchanged
// sync finds the maps as a fresh write of the last state would make them
// (nothing to repair), and a second Proxier that adopts the pins writes
// nothing either.
func TestRandomWalkMatchesAFreshWrite(t *testing.T) {
	e := newEnv(t)
	h := netnstest.NewHost(t, "walk")
	steps := 150
	if testing.Short() {
		steps = 40
	}
	for seed := range uint64(3) {
		log := &records{}
		pins := filepath.Join(e.BPFFS, "walk")
		o := kebpf.Options{Cgroup: e.Cgroup, PinPath: pins, NetNS: h.NS, Logger: slog.New(log),
			Packets: &fake.Proxier{}}
		p, err := kebpf.New(o)
		require.NoError(t, err)
		g := servicetest.New(servicetest.Options{Seed: seed, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}})
		walk, err := g.Walk(steps)
		require.NoError(t, err)
		ctx := context.Background()
		for i, st := range walk {
			require.NoError(t, p.Sync(ctx, st), "step %d", i)
		}
		last := walk[len(walk)-1]
		require.NoError(t, p.Sync(ctx, last))
		assert.False(t, log.has("differ"), "seed %d: the deep verify found the maps different: %v", seed, log.msgs)
		assert.False(t, log.has("repaired"), "seed %d: %v", seed, log.msgs)
		dump, err := p.Dump(ctx)
		require.NoError(t, err)
		require.NoError(t, p.Close())

		again := &records{}
		o.Logger = slog.New(again)
		q, err := kebpf.New(o)
		require.NoError(t, err)
		require.NoError(t, q.Sync(ctx, last))
		adopted, err := q.Dump(ctx)
		require.NoError(t, err)
		assert.Equal(t, dump, adopted, "seed %d: adopted maps changed", seed)
		require.NoError(t, q.Cleanup(ctx))
		require.NoError(t, q.Close())
	}
}
