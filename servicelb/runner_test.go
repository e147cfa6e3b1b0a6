package servicelb_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	minI  = time.Second
	maxI  = time.Minute
	retry = 2 * time.Second
)

// harness runs a Runner on a fake clock and proxier, and knows after each
// step what the runner decided to wait for.
type harness struct {
	t       *testing.T
	clk     *fake.Clock
	p       *fake.Proxier
	r       *servicelb.Runner
	waits   chan wait
	cancel  context.CancelFunc
	done    chan error
	mu      sync.Mutex
	results []servicelb.SyncResult
	pending []int
	stats   []servicelb.ChangeStats
	applied []*servicelb.State
}

type wait struct {
	due time.Time
	ok  bool
}

func newHarness(t *testing.T, sources ...string) (*harness, []*servicelb.Source) {
	t.Helper()
	h := &harness{t: t, clk: fake.NewClock(t0), p: &fake.Proxier{}, waits: make(chan wait, 100), done: make(chan error, 1)}
	r, err := servicelb.NewRunner(h.p, servicelb.RunnerOptions{
		MinSyncInterval: minI, MaxSyncInterval: maxI, RetryInterval: retry, Clock: h.clk,
		Hooks: servicelb.Hooks{
			Synced: func(r servicelb.SyncResult) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.results = append(h.results, r)
			},
			Pending: func(n int) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.pending = append(h.pending, n)
			},
			Changes: func(s servicelb.ChangeStats) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.stats = append(h.stats, s)
			},
			Applied: func(st *servicelb.State) {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.applied = append(h.applied, st)
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	servicelb.SetIdleHook(r, func(due time.Time, ok bool) { h.waits <- wait{due, ok} })
	var srcs []*servicelb.Source
	for _, s := range sources {
		srcs = append(srcs, r.Source(s))
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	return h, srcs
}

// idle waits until the runner waits again and returns until when (relative
// to the fake clock's now), or -1 when it waits for a change only.
func (h *harness) idle() time.Duration {
	h.t.Helper()
	select {
	case w := <-h.waits:
		if !w.ok {
			return -1
		}
		return w.due.Sub(h.clk.Now())
	case <-time.After(10 * time.Second):
		h.t.Fatal("runner never came back to wait")
		return 0
	}
}

func (h *harness) syncs() int { return len(h.p.Records()) }

func (h *harness) names(i int) []string {
	var out []string
	for _, s := range h.p.Records()[i].State.Services() {
		out = append(out, s.Name)
	}
	return out
}

func svc(name string, last byte) servicelb.Service {
	return servicelb.Service{
		Name:       name,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, last})},
		Ports:      []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
		Endpoints:  []servicelb.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 244, 0, last})}},
	}
}

func TestRunnerWaitsForEverySource(t *testing.T) {
	h, src := newHarness(t, "k8s", "file")
	if d := h.idle(); d != -1 {
		t.Fatalf("waiting %s before any source synced", d)
	}
	if err := src[0].Upsert(svc("a", 1)); err != nil {
		t.Fatal(err)
	}
	h.idle()
	src[0].Synced()
	if d := h.idle(); d != -1 || h.syncs() != 0 {
		t.Fatalf("with one source of two synced: wait %s, %d syncs", d, h.syncs())
	}
	if err := src[1].Upsert(svc("b", 2)); err != nil {
		t.Fatal(err)
	}
	h.idle()
	src[1].Synced()
	if d := h.idle(); d != maxI {
		t.Fatalf("after the first sync the runner waits %s, want the max interval", d)
	}
	if diff := cmp.Diff([]string{"a", "b"}, h.names(0)); h.syncs() != 1 || diff != "" {
		t.Fatalf("%d syncs; first applied (-want +got):\n%s", h.syncs(), diff)
	}
}

func TestRunnerCoalescesWithinMinInterval(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	src[0].Synced()
	if d := h.idle(); d != maxI || h.syncs() != 1 {
		t.Fatalf("first sync: %d syncs, then waits %s", h.syncs(), d)
	}
	h.clk.Advance(300 * time.Millisecond)
	for i, name := range []string{"a", "b", "c"} {
		if err := src[0].Upsert(svc(name, byte(i+1))); err != nil {
			t.Fatal(err)
		}
		if d := h.idle(); d != 700*time.Millisecond {
			t.Fatalf("after change %d the runner waits %s, want the rest of the min interval", i, d)
		}
	}
	if err := src[0].Delete("b"); err != nil {
		t.Fatal(err)
	}
	h.idle()
	if h.syncs() != 1 {
		t.Fatalf("synced before the min interval passed: %d syncs", h.syncs())
	}
	h.clk.Advance(700 * time.Millisecond)
	if d := h.idle(); d != maxI {
		t.Fatalf("after the coalesced sync the runner waits %s", d)
	}
	if diff := cmp.Diff([]string{"a", "c"}, h.names(1)); h.syncs() != 2 || diff != "" {
		t.Fatalf("%d syncs; coalesced sync applied (-want +got):\n%s", h.syncs(), diff)
	}
	if r := h.results[1]; r.Services != 3 || !r.QueuedAt.Equal(t0.Add(300*time.Millisecond)) {
		t.Errorf("sync result: %d services queued at %s", r.Services, r.QueuedAt)
	}
	// A change long after the last sync is applied at once.
	h.clk.Advance(10 * time.Second)
	src[0].Upsert(svc("d", 4))
	if d := h.idle(); d != maxI || h.syncs() != 3 {
		t.Fatalf("%d syncs, then waits %s", h.syncs(), d)
	}
}

func TestRunnerResyncsAtMaxInterval(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	src[0].Upsert(svc("a", 1))
	h.idle()
	src[0].Synced()
	h.idle()
	for i := 2; i <= 4; i++ {
		h.clk.Advance(maxI - time.Millisecond)
		if h.syncs() != i-1 {
			t.Fatalf("resynced before the max interval")
		}
		h.clk.Advance(time.Millisecond)
		if d := h.idle(); d != maxI || h.syncs() != i {
			t.Fatalf("resync %d: %d syncs, then waits %s", i, h.syncs(), d)
		}
		last := h.p.Records()[i-1]
		if !last.Changes.Empty() || h.results[i-1].Services != 0 {
			t.Errorf("a periodic resync reported changes: %+v", last.Changes)
		}
	}
}

func TestRunnerRetriesWithBackoff(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	boom := errors.New("boom")
	h.p.FailNext(boom, boom, boom)
	src[0].Upsert(svc("a", 1))
	h.idle()
	src[0].Synced()
	for i, want := range []time.Duration{retry, 2 * retry, 4 * retry} {
		if d := h.idle(); d != want {
			t.Fatalf("after failure %d the runner waits %s, want %s", i+1, d, want)
		}
		if hl := h.r.Health(); hl.Ready || !errors.Is(hl.LastError, boom) || hl.Pending != 1 || !hl.QueuedAt.Equal(t0) {
			t.Fatalf("health after failure %d: %+v", i+1, hl)
		}
		h.clk.Advance(want)
	}
	if d := h.idle(); d != maxI {
		t.Fatalf("after a success the runner waits %s", d)
	}
	if h.syncs() != 4 || h.p.Applied() == nil || h.p.Applied().Len() != 1 {
		t.Fatalf("%d syncs, applied %v", h.syncs(), h.p.Applied())
	}
	hl := h.r.Health()
	if !hl.Ready || hl.LastError != nil || hl.Pending != 0 || !hl.QueuedAt.IsZero() || !hl.Healthy(h.clk.Now(), time.Second) {
		t.Fatalf("health after recovery: %+v", hl)
	}
	if !slices.Equal(h.pending, []int{1, 1, 1, 1, 0}) {
		t.Errorf("pending reports %v", h.pending)
	}
}

func TestRunnerChangeDuringBackoffWaitsMinInterval(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	h.p.FailNext(errors.New("boom"))
	src[0].Synced()
	if d := h.idle(); d != retry {
		t.Fatalf("waits %s after a failure", d)
	}
	src[0].Upsert(svc("a", 1))
	if d := h.idle(); d != minI {
		t.Fatalf("a change during backoff waits %s, want the min interval", d)
	}
}

// TestRunnerStopsWithContext: Run returns why its context ended; a
// Runner runs once, and a second Run says so at once.
func TestRunnerStopsWithContext(t *testing.T) {
	h, _ := newHarness(t)
	h.idle()
	if err := h.r.Run(context.Background()); !errors.Is(err, servicelb.ErrRunnerStarted) {
		t.Fatalf("a second Run returned %v, want ErrRunnerStarted", err)
	}
	h.cancel()
	select {
	case err := <-h.done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v, want context.Canceled", err)
		}
		h.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestSourceValidationAndOwnership(t *testing.T) {
	h, src := newHarness(t, "a", "b")
	h.idle()
	good, bad := svc("good", 1), svc("bad", 2)
	bad.Ports[0].Port = 0
	err := src[0].Upsert(good, bad)
	if !errors.Is(err, servicelb.ErrInvalidPort) {
		t.Fatalf("upsert of a bad service: %v", err)
	}
	if _, ok := h.r.State().Service("good"); !ok {
		t.Fatal("the good service was not applied alongside the bad one")
	}
	// An invalid update keeps the last good version.
	worse := good
	worse.Ports = nil
	if err := src[0].Upsert(worse); err == nil {
		t.Fatal("invalid update accepted")
	}
	if s, _ := h.r.State().Service("good"); len(s.Ports) != 1 {
		t.Fatal("an invalid update replaced the last good version")
	}
	// Another source may not touch it.
	if err := src[1].Upsert(svc("good", 9)); !errors.Is(err, servicelb.ErrSourceConflict) {
		t.Fatalf("foreign upsert: %v", err)
	}
	if err := src[1].Delete("good"); !errors.Is(err, servicelb.ErrSourceConflict) {
		t.Fatalf("foreign delete: %v", err)
	}
	// Replace drops what the source no longer lists and keeps invalid
	// services' last good versions.
	if err := src[0].Upsert(svc("old", 3)); err != nil {
		t.Fatal(err)
	}
	if err := src[0].Replace([]servicelb.Service{worse, svc("new", 4)}); err == nil {
		t.Fatal("Replace accepted an invalid service")
	}
	var names []string
	for _, s := range h.r.State().Services() {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"good", "new"}, names); diff != "" {
		t.Fatalf("after Replace (-want +got):\n%s", diff)
	}
	// Once deleted, a name is free for another source.
	if err := src[0].Delete("good"); err != nil {
		t.Fatal(err)
	}
	if err := src[1].Upsert(svc("good", 9)); err != nil {
		t.Fatalf("upsert of a freed name: %v", err)
	}
}

func TestRunnerOptions(t *testing.T) {
	p := &fake.Proxier{}
	if _, err := servicelb.NewRunner(p, servicelb.RunnerOptions{MinSyncInterval: time.Hour, MaxSyncInterval: time.Minute}); err == nil {
		t.Error("min above max accepted")
	}
	if _, err := servicelb.NewRunner(p, servicelb.RunnerOptions{RetryInterval: -1}); err == nil {
		t.Error("negative interval accepted")
	}
	if _, err := servicelb.NewRunner(p, servicelb.RunnerOptions{Node: servicelb.NodeConfig{MasqueradeBit: 99}}); !errors.Is(err, servicelb.ErrInvalidNode) {
		t.Errorf("invalid node: %v", err)
	}
}

// TestRunnerRefusesWhatTheBackendCannotExpress: a service the backend
// cannot serve (a scheduler hint it does not honour, more endpoints than it
// holds) is refused at its source with ErrUnsupported or ErrCapacity and
// left out; every other change still reaches the proxier.
func TestRunnerRefusesWhatTheBackendCannotExpress(t *testing.T) {
	p := &fake.Proxier{Caps: servicelb.Capabilities{Backend: "narrow", Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}, MaxEndpoints: 2}}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{})
	require.NoError(t, err)
	src := r.Source("s")
	hinted := svc("hinted", 1)
	hinted.Scheduler = servicelb.SchedulerRoundRobin
	big := svc("big", 2)
	for i := range 3 {
		big.Endpoints = append(big.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 245, 0, byte(i)})})
	}
	err = src.Upsert(hinted, big, svc("good", 3))
	require.ErrorIs(t, err, servicelb.ErrUnsupported)
	require.ErrorIs(t, err, servicelb.ErrCapacity)
	var ve *servicelb.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "hinted", ve.Service)
	assert.Equal(t, "scheduler", ve.Field)
	assert.Contains(t, err.Error(), `the narrow backend honours "" (its default), "random"`)
	names := []string{}
	for _, s := range r.State().Services() {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"good"}, names)
}

// TestRunnerWaitsForAFirstSource: a Runner started before any source is
// registered does not sync the empty state it holds: it waits for a source
// to register and deliver.
func TestRunnerWaitsForAFirstSource(t *testing.T) {
	h, _ := newHarness(t)
	require.Equal(t, time.Duration(-1), h.idle(), "with no source, the runner must wait for one")
	h.clk.Advance(time.Hour)
	assert.Zero(t, h.syncs(), "synced before any source was registered")
	src := h.r.Source("late")
	require.NoError(t, src.Upsert(svc("a", 1)))
	require.Equal(t, time.Duration(-1), h.idle(), "a source that has not delivered holds the first sync back")
	src.Synced()
	h.idle()
	require.Equal(t, 1, h.syncs())
	assert.Equal(t, []string{"a"}, h.names(0))
}

// TestWaitSynced returns after the first successful sync, and at once
// afterwards; before it, it returns with the context.
func TestWaitSynced(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, h.r.WaitSynced(ctx), context.DeadlineExceeded)
	h.p.FailNext(errors.New("boom"))
	src[0].Synced()
	h.idle()
	select {
	case <-h.r.Synced():
		t.Fatal("a failed sync counted as the first sync")
	default:
	}
	h.clk.Advance(retry)
	h.idle()
	require.NoError(t, h.r.WaitSynced(context.Background()))
	require.NoError(t, h.r.WaitSynced(context.Background()))
}

// TestZeroStateIsNoState: only States a Builder made pass Check.
func TestZeroStateIsNoState(t *testing.T) {
	var nilState *servicelb.State
	require.ErrorIs(t, nilState.Check(), servicelb.ErrNoState)
	require.ErrorIs(t, (&servicelb.State{}).Check(), servicelb.ErrNoState)
	st, err := servicelb.NewState(servicelb.NodeConfig{})
	require.NoError(t, err)
	require.NoError(t, st.Check(), "an empty state made by NewState")
}

// TestRunnerReportsConflicts: a service that asks for a frontend another
// holds is served without it, and the Conflicts hook hears of it; the
// holder keeps its frontend although the newcomer's name sorts first.
func TestRunnerReportsConflicts(t *testing.T) {
	var got [][]servicelb.Conflict
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{Hooks: servicelb.Hooks{
		Conflicts: func(cs []servicelb.Conflict) { got = append(got, cs) },
	}})
	require.NoError(t, err)
	src := r.Source("s")
	require.NoError(t, src.Upsert(svc("web", 1)))
	thief := svc("thief", 2)
	thief.ClusterIPs = svc("web", 1).ClusterIPs
	require.NoError(t, src.Upsert(thief))
	require.Len(t, got, 1)
	require.Len(t, got[0], 1)
	assert.Equal(t, "web", got[0][0].Winner)
	assert.Equal(t, []string{"thief"}, got[0][0].Losers)
	require.NoError(t, src.Delete("thief"))
	require.Len(t, got, 2)
	assert.Empty(t, got[1], "the clash ended")
}

// TestRunnerLeftOut: a sync that left services out counts as a success
// for the rest; the services left out show in Health and the LeftOut
// hook, and no retry or backoff follows.
func TestRunnerLeftOut(t *testing.T) {
	var hooked []map[string]error
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{Hooks: servicelb.Hooks{
		LeftOut: func(m map[string]error) { hooked = append(hooked, m) },
	}})
	require.NoError(t, err)
	src := r.Source("s")
	require.NoError(t, src.Upsert(svc("a", 1), svc("b", 2)))
	src.Synced()
	bad := &servicelb.ValidationError{Service: "b", Field: "scheduler", Err: servicelb.ErrUnsupported}
	p.FailNext(bad)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	require.NoError(t, r.WaitSynced(context.Background()))
	cancel()
	<-done
	h := r.Health()
	assert.True(t, h.Ready)
	assert.NoError(t, h.LastError)
	assert.Contains(t, h.LeftOut, "b")
	require.Len(t, hooked, 1)
	assert.ErrorIs(t, hooked[0]["b"], servicelb.ErrUnsupported)
}
