package servicelb_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

func (h *harness) lastStats() servicelb.ChangeStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(h.t, h.stats)
	return h.stats[len(h.stats)-1]
}

func (h *harness) lastResult() servicelb.SyncResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(h.t, h.results)
	return h.results[len(h.results)-1]
}

// TestRunnerChangeKinds: a change to a service's endpoints alone is an
// endpoint change, any other a service change (and an endpoint change too
// when its endpoints changed with it); the counts follow the changes from
// arrival to the sync that applies them, and back when the sync fails.
func TestRunnerChangeKinds(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	stats := func(svcPending, epPending int, svcs, eps uint64) servicelb.ChangeStats {
		return servicelb.ChangeStats{ServicesPending: svcPending, EndpointsPending: epPending, Services: svcs, Endpoints: eps}
	}

	a := svc("a", 1)
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, stats(1, 1, 1, 1), h.lastStats(), "a service added with endpoints")

	a.Endpoints = append(a.Endpoints, servicelb.Endpoint{Addr: netip.MustParseAddr("10.244.0.9")})
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, stats(1, 1, 1, 2), h.lastStats(), "its endpoints changed before the sync: one service pending of each kind")

	src[0].Synced()
	h.idle()
	assert.Equal(t, stats(0, 0, 1, 2), h.lastStats(), "applied")

	a.Ports[0].Port = 8080
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, stats(1, 0, 2, 2), h.lastStats(), "a port changed, the endpoints kept: a service change alone")
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, stats(1, 0, 2, 2), h.lastStats(), "the same service again is no change")

	h.clk.Advance(minI)
	h.idle()
	assert.Equal(t, stats(0, 0, 2, 2), h.lastStats())
	a.Endpoints = a.Endpoints[:1]
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, stats(0, 1, 2, 3), h.lastStats(), "an endpoint gone: an endpoint change alone")

	h.p.FailNext(errors.New("boom"))
	h.clk.Advance(minI)
	h.idle()
	assert.Equal(t, stats(0, 1, 2, 3), h.lastStats(), "a failed sync leaves its changes pending")
	assert.Error(t, h.lastResult().Err)

	require.NoError(t, src[0].Delete("a"))
	h.idle()
	assert.Equal(t, stats(1, 1, 3, 4), h.lastStats(), "a service deleted with its endpoints")
	h.clk.Advance(retry)
	h.idle()
	assert.Equal(t, stats(0, 0, 3, 4), h.lastStats())
	assert.Equal(t, 1, h.lastResult().Services)
}

// TestRunnerTriggered: a sync reports when each change it applied was
// caused: the source's trigger time, else the change's arrival, each once
// per service; a failed sync keeps them for the next.
func TestRunnerTriggered(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	src[0].Synced()
	h.idle()
	assert.Nil(t, h.lastResult().Triggered, "a first sync of nothing")

	h.clk.Advance(10 * time.Second)
	cause := t0.Add(4 * time.Second)
	require.NoError(t, src[0].UpsertTriggered(cause, svc("a", 1)))
	h.idle()
	require.NoError(t, src[0].UpsertTriggered(cause, svc("b", 2)))
	h.idle()
	a := svc("a", 1)
	a.Endpoints[0].Ready = new(false)
	require.NoError(t, src[0].UpsertTriggered(cause, a))
	h.idle()
	require.NoError(t, src[0].UpsertTriggered(t0.Add(5*time.Second), a), "no change: no time")
	h.idle()
	require.NoError(t, src[0].Upsert(svc("c", 3)))
	arrived := h.clk.Now()
	h.idle()
	h.p.FailNext(errors.New("boom"))
	h.clk.Advance(minI)
	h.idle()
	assert.Nil(t, h.lastResult().Triggered, "a failed sync")
	h.clk.Advance(retry)
	h.idle()
	res := h.lastResult()
	require.NoError(t, res.Err)
	assert.Equal(t, []time.Time{cause, cause, arrived}, res.Triggered)

	h.clk.Advance(maxI)
	h.idle()
	res = h.lastResult()
	assert.Zero(t, res.Services)
	assert.Nil(t, res.Triggered, "a periodic resync")
}

// TestRunnerApplied: the Applied hook sees every state applied, periodic
// resyncs included, and none that failed.
func TestRunnerApplied(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	require.NoError(t, src[0].Upsert(svc("a", 1)))
	h.idle()
	src[0].Synced()
	h.idle()
	h.p.FailNext(errors.New("boom"))
	h.clk.Advance(maxI)
	h.idle()
	h.clk.Advance(retry)
	h.idle()
	require.Len(t, h.p.Records(), 3)
	assert.Equal(t, []*servicelb.State{h.p.Records()[0].State, h.p.Records()[2].State}, h.applied)
}

// marker is a Proxier that reports every sync full, or none.
type marker struct {
	*fake.Proxier
	full bool
}

func (m marker) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	rep, err := m.Proxier.Sync(ctx, st)
	rep.Full = m.full
	return rep, err
}

// TestRunnerFullSyncs: a sync is full when the proxier says so, and the
// Runner's syncs before its first success are full whatever it says.
func TestRunnerFullSyncs(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    servicelb.Proxier
		want []bool
	}{
		{"the fake reports the first", &fake.Proxier{}, []bool{true, true, false, false}},
		{"a proxier that reports every one", marker{Proxier: &fake.Proxier{}, full: true}, []bool{true, true, true, true}},
		{"a proxier that reports none", marker{Proxier: &fake.Proxier{}}, []bool{true, true, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []bool
			done := make(chan struct{}, 10)
			r, err := servicelb.NewRunner(tc.p, servicelb.RunnerOptions{MinSyncInterval: time.Millisecond, RetryInterval: time.Millisecond,
				Hooks: servicelb.Hooks{Synced: func(res servicelb.SyncResult) { got = append(got, res.Full); done <- struct{}{} }}})
			require.NoError(t, err)
			inner := tc.p
			if m, ok := inner.(marker); ok {
				inner = m.Proxier
			}
			inner.(*fake.Proxier).FailNext(errors.New("boom"))
			src := r.Source("s")
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan error)
			go func() { stopped <- r.Run(ctx) }()
			src.Synced()
			<-done
			<-done
			require.NoError(t, src.Upsert(svc("a", 1)))
			<-done
			require.NoError(t, src.Upsert(svc("b", 2)))
			<-done
			cancel()
			require.ErrorIs(t, <-stopped, context.Canceled)
			assert.Equal(t, tc.want, got, "failed first sync, first success, two changes")
		})
	}
}

// TestHealthStalled: the runner is stalled once a change has waited the
// timeout, ready or not; healthy when ready and not stalled.
func TestHealthStalled(t *testing.T) {
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name             string
		h                servicelb.Health
		stalled, healthy bool
	}{
		{"nothing queued", servicelb.Health{Ready: true}, false, true},
		{"not ready, nothing queued", servicelb.Health{}, false, false},
		{"queued within the bound", servicelb.Health{Ready: true, QueuedAt: now.Add(-59 * time.Second)}, false, true},
		{"queued at the bound", servicelb.Health{Ready: true, QueuedAt: now.Add(-time.Minute)}, true, false},
		{"not ready, queued past the bound", servicelb.Health{QueuedAt: now.Add(-2 * time.Minute)}, true, false},
	} {
		assert.Equal(t, tc.stalled, tc.h.Stalled(now, time.Minute), tc.name)
		assert.Equal(t, tc.healthy, tc.h.Healthy(now, time.Minute), tc.name)
	}
}

// TestRunnerAppliedWithoutLeftOut: the state a sync applied, as Applied
// and the Applied hook give it, lacks the services the proxier left out:
// the kernel does not hold them.
func TestRunnerAppliedWithoutLeftOut(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	require.NoError(t, src[0].Upsert(svc("a", 1), svc("b", 2)))
	h.idle()
	h.p.FailNext(&servicelb.ValidationError{Service: "b", Field: "ports", Err: servicelb.ErrRefused})
	src[0].Synced()
	h.idle()
	require.Len(t, h.applied, 1)
	for _, st := range []*servicelb.State{h.applied[0], h.r.Applied()} {
		_, ok := st.Service("b")
		assert.False(t, ok, "a service left out is in the applied state")
		_, ok = st.Service("a")
		assert.True(t, ok)
	}
}
