package syncer

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var errRace = errors.New("lost a race")

// fakeBackend records calls and fails as told.
type fakeBackend struct {
	calls    []string
	checkOK  bool
	verifyOK bool
	// errs are returned by the next calls of each kind, one each.
	errs map[string][]error
}

func newFake() *fakeBackend {
	return &fakeBackend{checkOK: true, verifyOK: true, errs: map[string][]error{}}
}

func (f *fakeBackend) next(kind string) error {
	f.calls = append(f.calls, kind)
	if es := f.errs[kind]; len(es) > 0 {
		f.errs[kind] = es[1:]
		return es[0]
	}
	return nil
}

func (f *fakeBackend) Check(context.Context) (bool, error)  { return f.checkOK, f.next("check") }
func (f *fakeBackend) Verify(context.Context) (bool, error) { return f.verifyOK, f.next("verify") }
func (f *fakeBackend) Write(context.Context, *servicelb.State) error {
	return f.next("write")
}
func (f *fakeBackend) Apply(context.Context, *servicelb.State, *servicelb.Changes) (bool, error) {
	return false, f.next("apply")
}

func (f *fakeBackend) take() []string {
	c := f.calls
	f.calls = nil
	return c
}

type fakeCleaner struct {
	calls [][]servicelb.StaleFlow
	fail  int
}

func (c *fakeCleaner) DeleteStale(_ context.Context, fs []servicelb.StaleFlow) (int, error) {
	c.calls = append(c.calls, fs)
	if c.fail > 0 {
		c.fail--
		return 0, errors.New("conntrack is busy")
	}
	return len(fs), nil
}

// clock is a manual clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func udpService(eps ...string) servicelb.Service {
	s := servicelb.Service{Name: "ns/dns", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: netip.MustParseAddr(e)})
	}
	return s
}

func state(t *testing.T, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(servicelb.NodeConfig{}, svcs...)
	require.NoError(t, err)
	return st
}

func newEngine(b Backend, c *fakeCleaner, clk *clock) *Engine {
	o := Options{Name: "fake", Now: clk.now, Retryable: func(err error) bool { return errors.Is(err, errRace) }}
	if c != nil {
		o.Cleaner = c
	}
	return New(b, o)
}

func TestSyncKinds(t *testing.T) {
	b, clk := newFake(), &clock{t: time.Unix(1000, 0)}
	e := newEngine(b, nil, clk)
	ctx := context.Background()
	s1, s2 := state(t, udpService("10.0.0.1")), state(t, udpService("10.0.0.2"))
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s1)))
	assert.Equal(t, []string{"write"}, b.take(), "first sync")
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s1)))
	assert.Equal(t, []string{"check", "verify"}, b.take(), "an unchanged state sends nothing; the periodic sync looks in depth")
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s2)))
	assert.Equal(t, []string{"check", "apply"}, b.take(), "a change")
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s1)))
	assert.Equal(t, []string{"check", "apply"}, b.take(), "no deep verify with a change before the interval")
	clk.t = clk.t.Add(DefaultVerifyInterval)
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s2)))
	assert.Equal(t, []string{"check", "verify", "apply"}, b.take(), "a deep verify once the interval passed, then the change")
	b.checkOK = false
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s2)))
	assert.Equal(t, []string{"check", "write"}, b.take(), "a failed check repairs")
	b.checkOK = true
	clk.t = clk.t.Add(DefaultVerifyInterval)
	b.verifyOK = false
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s2)))
	assert.Equal(t, []string{"check", "verify", "write"}, b.take(), "a failed deep verify repairs")
	e.Forget()
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, s2)))
	assert.Equal(t, []string{"write"}, b.take(), "after Forget")
}

func TestSyncRefusesNoStateAndClosed(t *testing.T) {
	e := newEngine(newFake(), nil, &clock{})
	require.ErrorIs(t, servicetest.SyncErr(e.Sync(context.Background(), &servicelb.State{})), servicelb.ErrNoState)
	require.ErrorIs(t, servicetest.SyncErr(e.Sync(context.Background(), nil)), servicelb.ErrNoState)
	e.Close()
	require.ErrorIs(t, servicetest.SyncErr(e.Sync(context.Background(), state(t))), servicelb.ErrClosed)
}

func TestSyncRetriesLostRaces(t *testing.T) {
	b, clk := newFake(), &clock{}
	e := newEngine(b, nil, clk)
	ctx := context.Background()
	b.errs["write"] = []error{errRace, errRace, errRace}
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1")))))
	assert.Equal(t, []string{"write", "write", "write", "write"}, b.take())
	b.errs["check"] = make([]error, DefaultAttempts)
	for i := range b.errs["check"] {
		b.errs["check"][i] = errRace
	}
	err := servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.2"))))
	require.ErrorIs(t, err, errRace)
	assert.Contains(t, err.Error(), fmt.Sprintf("after %d attempts", DefaultAttempts))
	assert.Len(t, b.take(), DefaultAttempts)
	b.errs["apply"] = []error{errors.New("no such thing")}
	require.Error(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.3")))), "other errors are not retried")
	assert.Equal(t, []string{"check", "apply"}, b.take())
}

func TestDeepVerifyPutOffWhenItLosesRaces(t *testing.T) {
	b, clk := newFake(), &clock{t: time.Unix(1000, 0)}
	e := newEngine(b, nil, clk)
	ctx := context.Background()
	st := state(t, udpService("10.0.0.1"))
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, st)))
	b.take()
	clk.t = clk.t.Add(DefaultVerifyInterval)
	b.errs["verify"] = []error{errRace}
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, st)), "a deep verify that loses a race fails no sync")
	st2 := state(t, udpService("10.0.0.2"))
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, st2)))
	assert.Equal(t, []string{"check", "verify", "check", "verify", "apply"}, b.take(), "the deep verify comes again on the next sync")
}

func TestRefusedChangeRepairs(t *testing.T) {
	b := newFake()
	e := newEngine(b, nil, &clock{})
	ctx := context.Background()
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1")))))
	b.take()
	b.errs["apply"] = []error{fmt.Errorf("delete rule: %w", syscall.ENOENT)}
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.2")))))
	assert.Equal(t, []string{"check", "apply", "write"}, b.take(), "a change refused for drift becomes a whole write")
}

func TestStaleFlowsKeptUntilDeleted(t *testing.T) {
	b, c := newFake(), &fakeCleaner{}
	e := newEngine(b, c, &clock{})
	ctx := context.Background()
	ep := netip.MustParseAddr
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1", "10.0.0.2")))))
	require.Len(t, c.calls, 1, "the first sync reconciles the whole table")
	assert.Equal(t, []netip.AddrPort{netip.AddrPortFrom(ep("10.0.0.1"), 53), netip.AddrPortFrom(ep("10.0.0.2"), 53)}, c.calls[0][0].Serving)
	c.fail = 1
	err := servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1"))))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "sync applied")
	// The endpoint serves again before the retry: the pending filter
	// keeps its flows.
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1", "10.0.0.2")))))
	require.Len(t, c.calls, 3)
	assert.Equal(t, []netip.AddrPort{netip.AddrPortFrom(ep("10.0.0.1"), 53), netip.AddrPortFrom(ep("10.0.0.2"), 53)}, c.calls[2][0].Serving)
	require.NoError(t, servicetest.SyncErr(e.Sync(ctx, state(t, udpService("10.0.0.1", "10.0.0.2")))))
	assert.Len(t, c.calls, 3, "nothing pending, nothing deleted")
}

// refusing is a backend that refuses every state holding a service named
// "bad" with an endpoint 10.0.0.9, with an error naming it, as a
// capability check does.
type refusing struct {
	fakeBackend
	got []*servicelb.State
}

func (r *refusing) refuse(st *servicelb.State) error {
	r.got = append(r.got, st)
	if s, ok := st.Service("bad"); ok && slices.ContainsFunc(s.Endpoints, func(e servicelb.Endpoint) bool {
		return e.Addr == netip.MustParseAddr("10.0.0.9")
	}) {
		return &servicelb.ValidationError{Service: "bad", Field: "endpoints", Err: servicelb.ErrUnsupported}
	}
	return nil
}

func (r *refusing) Write(_ context.Context, st *servicelb.State) error { return r.refuse(st) }
func (r *refusing) Apply(_ context.Context, st *servicelb.State, _ *servicelb.Changes) (bool, error) {
	return false, r.refuse(st)
}

// TestServiceLeftOut: a service the backend refuses is left out and the
// rest applied in the same Sync, which says so in its report, with the
// state applied; the service is not tried again until it changes.
func TestServiceLeftOut(t *testing.T) {
	r := &refusing{fakeBackend: *newFake()}
	e := newEngine(r, nil, &clock{})
	ctx := context.Background()
	bad := udpService("10.0.0.9")
	bad.Name = "bad"
	b, err := servicelb.NewBuilder(servicelb.NodeConfig{})
	require.NoError(t, err)
	require.NoError(t, b.Upsert(udpService("10.0.0.1")))
	require.NoError(t, b.Upsert(bad))
	rep, err := e.Sync(ctx, b.State())
	require.NoError(t, err)
	require.Len(t, rep.LeftOut, 1)
	require.ErrorIs(t, rep.LeftOut["bad"], servicelb.ErrUnsupported)
	assert.Same(t, e.Applied(), rep.Applied, "the report's state is not the one applied")
	require.Len(t, r.got, 2)
	_, has := r.got[1].Service("bad")
	assert.False(t, has, "the second try still holds the refused service")
	assert.Equal(t, 1, e.Applied().Len(), "the rest was not applied")

	// A change to another service is applied; the refused one is not
	// tried, nor is it after an upsert that changes nothing of it.
	require.NoError(t, b.Upsert(udpService("10.0.0.2")))
	require.NoError(t, b.Upsert(bad))
	r.got = nil
	rep, err = e.Sync(ctx, b.State())
	require.NoError(t, err)
	assert.Contains(t, rep.LeftOut, "bad")
	require.Len(t, r.got, 1)
	_, has = r.got[0].Service("bad")
	assert.False(t, has, "a service left out was tried again unchanged")

	// Once it changes it is tried again: still refused, it stays out.
	still := bad
	still.Endpoints = append(udpService("10.0.0.7").Endpoints, bad.Endpoints...)
	require.NoError(t, b.Upsert(still))
	r.got = nil
	rep, err = e.Sync(ctx, b.State())
	require.NoError(t, err)
	require.NotEmpty(t, r.got)
	_, has = r.got[0].Service("bad")
	assert.True(t, has, "the changed service was not tried again")
	assert.Contains(t, rep.LeftOut, "bad")
	_, has = e.Applied().Service("bad")
	assert.False(t, has)

	// Changed so that the backend takes it, it goes in.
	fixed := bad
	fixed.Endpoints = udpService("10.0.0.8").Endpoints
	require.NoError(t, b.Upsert(fixed))
	rep, err = e.Sync(ctx, b.State())
	require.NoError(t, err)
	assert.Empty(t, rep.LeftOut, "left out after it changed so that the backend takes it")
	assert.Same(t, b.State(), rep.Applied, "nothing left out any more: the state applied is the one given")
	assert.Equal(t, 2, e.Applied().Len())
	got, ok := e.Applied().Service("bad")
	require.True(t, ok)
	assert.Equal(t, fixed.Endpoints[0].Addr, got.Endpoints[0].Addr)
}

// kernelRefusal is a kernel's refusal as a backend's Traced reads it:
// the service ports each part of it is traced to, and a part of no port.
type kernelRefusal struct {
	ports  map[servicelb.ServicePortKey]error
	shared error
}

func (k *kernelRefusal) Error() string { return "the kernel refused a batch" }

func (k *kernelRefusal) Unwrap() []error {
	var out []error
	if k.shared != nil {
		out = append(out, k.shared)
	}
	for _, err := range k.ports {
		out = append(out, err)
	}
	return out
}

func traced(err error) map[servicelb.ServicePortKey]error {
	var k *kernelRefusal
	if !errors.As(err, &k) || k.shared != nil {
		return nil
	}
	return k.ports
}

// refusedByKernel is a backend whose batches the kernel refuses while they
// hold the service "bad": the refusal is traced to its port, with an
// errno (ENOENT looks like drift), and with shared, to something of no
// port as well.
type refusedByKernel struct {
	fakeBackend
	errno  syscall.Errno
	shared error
	// gone refuses every batch for "bad", in the state or not, as the
	// kernel refuses the removal of objects someone else uses.
	gone bool
	got  []*servicelb.State
}

func (r *refusedByKernel) refuse(kind string, st *servicelb.State) error {
	r.calls = append(r.calls, kind)
	r.got = append(r.got, st)
	if _, ok := st.Service("bad"); !ok && !r.gone {
		return nil
	}
	k := servicelb.ServicePortKey{Service: "bad", Port: "dns", Family: servicelb.IPv4}
	return fmt.Errorf("commit: %w", &kernelRefusal{ports: map[servicelb.ServicePortKey]error{k: fmt.Errorf("add rule: %w", r.errno)}, shared: r.shared})
}

func (r *refusedByKernel) Write(_ context.Context, st *servicelb.State) error {
	return r.refuse("write", st)
}

func (r *refusedByKernel) Apply(_ context.Context, st *servicelb.State, _ *servicelb.Changes) (bool, error) {
	return false, r.refuse("apply", st)
}

// TestKernelRefusalLeavesOut: a refusal of the kernel that the backend
// traces to one service's port leaves that service out and applies the
// rest in the same Sync, on a first sync as on a change the kernel
// refuses for what looks like drift (after the whole write that follows
// fails too) or for another reason; a refusal that touches anything of no
// port fails the Sync as before.
func TestKernelRefusalLeavesOut(t *testing.T) {
	bad := udpService("10.0.0.9")
	bad.Name, bad.Ports[0].Name = "bad", "dns"
	good, other := udpService("10.0.0.1"), udpService("10.0.0.2")
	other.Name = "ns/other"
	for _, tc := range []struct {
		name  string
		errno syscall.Errno
		calls []string
	}{
		{"drift", syscall.ENOENT, []string{"check", "apply", "write", "check", "apply"}},
		{"other", syscall.EINVAL, []string{"check", "apply", "check", "apply"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &refusedByKernel{fakeBackend: *newFake(), errno: tc.errno}
			e := New(r, Options{Name: "fake", Now: (&clock{}).now, Traced: traced})
			ctx := context.Background()
			b, err := servicelb.NewBuilder(servicelb.NodeConfig{})
			require.NoError(t, err)
			require.NoError(t, b.Upsert(good))
			require.NoError(t, b.Upsert(bad))
			rep, err := e.Sync(ctx, b.State())
			require.NoError(t, err)
			require.Len(t, rep.LeftOut, 1)
			require.ErrorIs(t, rep.LeftOut["bad"], servicelb.ErrRefused)
			require.ErrorIs(t, rep.LeftOut["bad"], tc.errno)
			var ve *servicelb.ValidationError
			require.ErrorAs(t, rep.LeftOut["bad"], &ve)
			assert.Equal(t, "bad", ve.Service)
			assert.Equal(t, "bad:dns/ipv4", ve.Value)
			assert.Equal(t, []string{"write", "write"}, r.take(), "a first sync")
			assert.Equal(t, 1, e.Applied().Len())

			// A change of another service: the refused one is not
			// tried. Then it changes, and the kernel refuses it in a
			// change: it stays out, the rest goes in.
			require.NoError(t, b.Upsert(other))
			rep, err = e.Sync(ctx, b.State())
			require.NoError(t, err)
			assert.Contains(t, rep.LeftOut, "bad")
			assert.Equal(t, []string{"check", "apply"}, r.take())
			assert.Equal(t, 2, e.Applied().Len())
			bad2 := bad
			bad2.Endpoints = udpService("10.0.0.8").Endpoints
			good2 := udpService("10.0.0.3")
			require.NoError(t, b.Upsert(bad2))
			require.NoError(t, b.Upsert(good2))
			rep, err = e.Sync(ctx, b.State())
			require.NoError(t, err)
			assert.Equal(t, tc.calls, r.take())
			assert.Contains(t, rep.LeftOut, "bad")
			got, _ := e.Applied().Service("ns/dns")
			assert.Equal(t, good2.Endpoints[0].Addr, got.Endpoints[0].Addr, "the rest was not applied")
			_, has := e.Applied().Service("bad")
			assert.False(t, has)
		})
	}

	t.Run("gone", func(t *testing.T) {
		// The kernel refuses the removal of a service's objects: leaving
		// out a service the state no longer has would not help.
		r := &refusedByKernel{fakeBackend: *newFake(), errno: syscall.EBUSY}
		e := New(r, Options{Name: "fake", Now: (&clock{}).now, Traced: traced})
		r.gone = true
		rep, err := e.Sync(context.Background(), state(t, good))
		require.ErrorIs(t, err, syscall.EBUSY)
		assert.Empty(t, rep.LeftOut, "a refusal about a service gone left a service out")
		assert.Nil(t, rep.Applied)
	})

	t.Run("shared", func(t *testing.T) {
		r := &refusedByKernel{fakeBackend: *newFake(), errno: syscall.EINVAL, shared: errors.New("add set: invalid argument")}
		e := New(r, Options{Name: "fake", Now: (&clock{}).now, Traced: traced})
		rep, err := e.Sync(context.Background(), state(t, good, bad))
		require.Error(t, err)
		assert.Empty(t, rep.LeftOut, "a refusal of something of no port left a service out")
		assert.Nil(t, rep.Applied)
		assert.Equal(t, []string{"write"}, r.take())
		assert.Nil(t, e.Applied())
	})
}
