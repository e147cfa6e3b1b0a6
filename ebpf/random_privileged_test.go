//go:build privileged

package ebpf_test

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	kebpf "github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

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
			require.NoError(t, servicetest.SyncErr(p.Sync(ctx, st)), "step %d", i)
		}
		last := walk[len(walk)-1]
		require.NoError(t, servicetest.SyncErr(p.Sync(ctx, last)))
		assert.False(t, log.has("differ"), "seed %d: the deep verify found the maps different: %v", seed, log.msgs)
		assert.False(t, log.has("repaired"), "seed %d: %v", seed, log.msgs)
		dump, err := p.Dump(ctx)
		require.NoError(t, err)
		require.NoError(t, p.Close())

		again := &records{}
		// A restarted process: its own logger and packet path (the
		// first Proxier's Close closed its own).
		o.Logger, o.Packets = slog.New(again), &fake.Proxier{}
		q, err := kebpf.New(o)
		require.NoError(t, err)
		require.NoError(t, servicetest.SyncErr(q.Sync(ctx, last)))
		adopted, err := q.Dump(ctx)
		require.NoError(t, err)
		assert.Equal(t, dump, adopted, "seed %d: adopted maps changed", seed)
		require.NoError(t, q.Cleanup(ctx))
		require.NoError(t, q.Close())
	}
}

// TestPinsRepairedByADeepVerify: a map's pin and a link's pin someone
// removed (the hook still attached) are put back by the next deep
// verify: the next sync of an unchanged state, or the next sync once
// VerifyInterval has passed. A sync that changes something before that
// writes the change and looks at nothing else.
func TestPinsRepairedByADeepVerify(t *testing.T) {
	e := newEnv(t)
	h := netnstest.NewHost(t, "pins")
	ctx := context.Background()
	state := func(addr string) *servicelb.State {
		st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{Name: "default/web",
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}},
			Endpoints:  []servicelb.Endpoint{{Addr: netip.MustParseAddr(addr)}}})
		require.NoError(t, err)
		return st
	}
	for _, tc := range []struct {
		name     string
		interval time.Duration
	}{{"unchanged", time.Hour}, {"interval passed", time.Nanosecond}} {
		t.Run(tc.name, func(t *testing.T) {
			log := &records{}
			pins := filepath.Join(e.BPFFS, "pins")
			p, err := kebpf.New(kebpf.Options{Cgroup: e.Cgroup, PinPath: pins, NetNS: h.NS, Logger: slog.New(log),
				VerifyInterval: tc.interval})
			require.NoError(t, err)
			defer func() {
				assert.NoError(t, p.Cleanup(ctx))
				assert.NoError(t, p.Close())
			}()
			require.NoError(t, servicetest.SyncErr(p.Sync(ctx, state("10.244.1.2"))))
			gone := []string{mapPin(t, pins, "kp_sets"), filepath.Join(pins, "link_sendmsg4")}
			for _, pin := range gone {
				require.NoError(t, os.Remove(pin))
			}
			require.NoError(t, servicetest.SyncErr(p.Sync(ctx, state("10.244.1.3"))))
			if tc.interval == time.Hour {
				assert.False(t, log.has("repaired"), "a change within VerifyInterval writes the change alone: %v", log.msgs)
				for _, pin := range gone {
					assert.NoFileExists(t, pin)
				}
				require.NoError(t, servicetest.SyncErr(p.Sync(ctx, state("10.244.1.3"))))
			}
			assert.True(t, log.has("pin removed by someone else"), "%v", log.msgs)
			assert.True(t, log.has("kernel state repaired"), "%v", log.msgs)
			for _, pin := range gone {
				assert.FileExists(t, pin)
			}
			assert.Len(t, attachedPrograms(t, e.Cgroup), 8)
			require.NoError(t, servicetest.SyncErr(p.Sync(ctx, state("10.244.1.3"))))
			assert.Equal(t, 1, log.count("kernel state repaired"), "repaired once: %v", log.msgs)
		})
	}
}
