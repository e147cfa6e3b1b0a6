package servicelb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is the Runner's source of time; tests inject a fake one
// (servicelb/fake.Clock).
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once after d; at once if d <= 0.
	NewTimer(d time.Duration) Timer
}

// Timer is a timer made by a Clock.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer {
	return realTimer{time.NewTimer(d)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// DefaultMaxSyncInterval is RunnerOptions.MaxSyncInterval's default.
const DefaultMaxSyncInterval = 30 * time.Second

// RunnerOptions configure a Runner. The zero value of each field means its
// default.
type RunnerOptions struct {
	// Node is the node the services are validated and selected for.
	Node NodeConfig
	// MinSyncInterval is the least time between the starts of two syncs:
	// changes that arrive meanwhile are applied together. Default 1s.
	MinSyncInterval time.Duration
	// MaxSyncInterval is the most time between two syncs: a sync runs this
	// long after the last one even without changes, and the proxier checks
	// its kernel state in depth and restores it. Default 30s, as
	// kube-proxy's sync period.
	MaxSyncInterval time.Duration
	// RetryInterval is the wait before retrying a failed sync; it doubles
	// with each further failure, up to MaxSyncInterval. Default 1s.
	RetryInterval time.Duration
	// Clock defaults to the system clock.
	Clock Clock
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
	// Hooks are called for metrics.
	Hooks Hooks
}

// Hooks let an agent export metrics. Every field is optional. Hooks are
// called from the Runner's goroutines and must not block.
type Hooks struct {
	// Synced is called after every sync attempt.
	Synced func(SyncResult)
	// Pending is called with the number of services changed and not yet
	// applied, whenever it changes.
	Pending func(n int)
	// Conflicts is called with every frontend clash (see Conflict)
	// whenever they change: a source may report Conflict.Err for each
	// loser.
	Conflicts func([]Conflict)
	// LeftOut is called with the services the proxier left out of a sync
	// (SyncReport.LeftOut), each with its error, whenever they change.
	LeftOut func(map[string]error)
	// Applied is called after every successful sync, before Synced,
	// with the state the proxier applied, without the services it left
	// out (the same state again after a periodic sync): for what must
	// follow the kernel's state, such as the health check node ports
	// (package healthcheck). The next sync waits for it, so it must be
	// quick.
	Applied func(*State)
	// Changes is called with the counts of changes taken and pending,
	// by kind, whenever they change. Calls from a source's goroutine and
	// from Run's may arrive out of order: the totals never decrease, so
	// a call whose totals are below those of one before is stale.
	Changes func(ChangeStats)
}

// ChangeStats counts the changes a Runner took from its sources, by kind,
// as kube-proxy counts Service and EndpointSlice changes. A change to a
// service's endpoints alone is an endpoint change. Any other change (a
// service added or deleted, or a change to its ports, addresses, policies
// and so on) is a service change, and also an endpoint change when the
// endpoints changed with it (a service added with endpoints, or deleted
// with some). A service that changes because another one took or gave
// up a frontend it asks for has a service change. An upsert that changes
// nothing is no change.
type ChangeStats struct {
	// ServicesPending and EndpointsPending are the numbers of services
	// with a service change, or an endpoint change, not yet applied
	// (being applied included).
	ServicesPending, EndpointsPending int
	// Services and Endpoints count the changes of each kind taken since
	// the Runner was made, one per service per upsert or delete.
	Services, Endpoints uint64
}

// SyncResult describes one sync attempt.
type SyncResult struct {
	Start    time.Time
	Duration time.Duration
	// Services is the number of services the sync applied changes of; zero
	// for a periodic resync.
	Services int
	// QueuedAt is when the oldest change the sync applied was made; zero
	// for a periodic resync. End minus QueuedAt is the network programming
	// latency.
	QueuedAt time.Time
	// Triggered holds, sorted, when each change the sync applied was
	// caused: the time its source gave (Source.UpsertTriggered), else
	// when the change arrived; each time once per service. End minus
	// each is the network programming latency as kube-proxy measures it,
	// one sample per change. Nil for a periodic resync and for a failed
	// sync, whose changes stay queued with their times.
	Triggered []time.Time
	// Full reports that the sync wrote (or tried to write) the whole
	// state rather than the changes since the last one: the first sync,
	// a repair of what someone else changed in the kernel, a change of
	// the node (SyncReport.Full); the Runner's syncs before its first
	// success are full whatever the proxier says.
	Full bool
	// Families holds what the sync did in each address family the
	// proxier programs (Capabilities.AddressFamilies), in that order:
	// every sync programs them all, as a sync of each of kube-proxy's
	// per-family proxiers would.
	Families []FamilySync
	// Err is the proxier's error.
	Err error
}

// FamilySync is what one sync did in one address family.
type FamilySync struct {
	Family Family
	// Triggered holds, sorted, the times of SyncResult.Triggered whose
	// changes touched the family, as kube-proxy's proxier of the family
	// takes them: a change to the service's endpoints of the family, or
	// any other change to a service served in the family (before or
	// after it). A change of endpoints of both families counts in both.
	// Nil when SyncResult.Triggered is nil.
	Triggered []time.Time
}

// End returns when the sync finished.
func (r SyncResult) End() time.Time { return r.Start.Add(r.Duration) }

// Health reports whether the kernel is keeping up with the desired state.
type Health struct {
	// Ready is set once every source has synced and a sync has succeeded.
	Ready bool
	// QueuedAt is when the oldest change not yet applied was made; zero
	// when every change is applied.
	QueuedAt time.Time
	// AppliedAt is when the last successful sync finished.
	AppliedAt time.Time
	// Pending is the number of services changed and not yet applied.
	Pending int
	// LastError is the last sync's error, nil after a success.
	LastError error
	// LeftOut are the services the proxier left out of the last sync
	// (SyncReport.LeftOut), each with its error; the rest is applied.
	LeftOut map[string]error
	// Families holds the changes waiting in each address family the
	// proxier programs, in the order of Capabilities.AddressFamilies,
	// with the changes that touched it as SyncResult.Families counts
	// them. A change of the node touches every family.
	Families []FamilyHealth
}

// FamilyHealth reports the changes of one address family.
type FamilyHealth struct {
	Family Family
	// QueuedAt is when the oldest change of the family not yet applied
	// was made; zero when every change of it is applied.
	QueuedAt time.Time
	// LastQueuedAt is when the latest change of the family was made,
	// applied or not; zero before the first.
	LastQueuedAt time.Time
}

// Stalled reports whether a change of the family has waited timeout or
// longer to be applied, as Health.Stalled.
func (h FamilyHealth) Stalled(now time.Time, timeout time.Duration) bool {
	return !h.QueuedAt.IsZero() && now.Sub(h.QueuedAt) >= timeout
}

// Healthy reports whether the runner is ready and no change has waited
// timeout or longer.
func (h Health) Healthy(now time.Time, timeout time.Duration) bool {
	return h.Ready && !h.Stalled(now, timeout)
}

// Stalled reports whether a change has waited timeout or longer to be
// applied: the kernel is not keeping up with the desired state (or the
// first sync is that late). A runner that is not ready yet is not stalled
// while what it was given is younger than timeout.
func (h Health) Stalled(now time.Time, timeout time.Duration) bool {
	return !h.QueuedAt.IsZero() && now.Sub(h.QueuedAt) >= timeout
}

// ErrSourceConflict: a source changed a service another source owns.
var ErrSourceConflict = errors.New("service belongs to another source")

// Runner feeds a Proxier from named sources of services: it validates every
// change as it arrives, coalesces changes, and syncs no more often than
// MinSyncInterval, at least every MaxSyncInterval, retrying failures with
// backoff. It never syncs before a source is registered and every
// registered source has reported its initial contents, so that a restart
// never applies a partial (or empty) state over a working node.
type Runner struct {
	p     Proxier
	opts  RunnerOptions
	clock Clock
	log   *slog.Logger
	wake  chan struct{}
	// idle, when set (by tests), is called each time Run waits, with the
	// time it waits for.
	idle func(due time.Time, ok bool)
	// started is set by the first Run.
	started atomic.Bool

	// reportMu orders the reports of pending changes: each snapshot of
	// the counts takes a sequence number under mu (snapSeq), and one
	// reported after a newer one is dropped, so that the hooks never
	// end on an older count (a report made before a sync, delayed past
	// the report made after it).
	reportMu sync.Mutex
	reported uint64

	mu      sync.Mutex
	snapSeq uint64
	b       *Builder
	sources map[string]*Source
	owner   map[string]*Source
	// pend is what changed since the last sync began; inflight what the
	// running sync applies.
	pend, inflight pending
	fresh          bool // a change arrived since the last sync began
	applied        *State
	appliedAt      time.Time
	lastErr        error
	succeeded      bool
	clashVer       uint64 // of the clashes last reported
	leftOut        map[string]error
	// firstSync is closed by the first successful sync.
	firstSync chan struct{}

	// families are the proxier's; famLast holds, by familyIndex, when the
	// latest change of each was made.
	families []Family
	famLast  [2]time.Time
	// total counts the changes ever taken, by kind.
	total [numKinds]uint64
}

// NewRunner returns a Runner that applies changes to p.
func NewRunner(p Proxier, o RunnerOptions) (*Runner, error) {
	b, err := NewBuilder(o.Node)
	if err != nil {
		return nil, err
	}
	if err := b.Require(p.Capabilities()); err != nil {
		return nil, err
	}
	if o.MinSyncInterval < 0 || o.MaxSyncInterval < 0 || o.RetryInterval < 0 {
		return nil, fmt.Errorf("servicelb: negative sync interval")
	}
	if o.MinSyncInterval == 0 {
		o.MinSyncInterval = time.Second
	}
	if o.MaxSyncInterval == 0 {
		o.MaxSyncInterval = DefaultMaxSyncInterval
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = time.Second
	}
	if o.MinSyncInterval > o.MaxSyncInterval {
		return nil, fmt.Errorf("servicelb: MinSyncInterval %s exceeds MaxSyncInterval %s", o.MinSyncInterval, o.MaxSyncInterval)
	}
	r := &Runner{
		p: p, opts: o, clock: o.Clock, log: o.Logger, b: b,
		wake: make(chan struct{}, 1), firstSync: make(chan struct{}),
		sources: map[string]*Source{}, owner: map[string]*Source{}, pend: newPending(),
		clashVer: b.clashVer,
	}
	caps := p.Capabilities()
	r.families = slices.Clone(caps.AddressFamilies())
	if r.clock == nil {
		r.clock = realClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// Source returns the source of that name, registering it on first use. While
// a registered source has not called Synced, the Runner does not sync.
func (r *Runner) Source(name string) *Source {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.sources[name]; ok {
		return s
	}
	s := &Source{r: r, name: name, owned: map[string]bool{}}
	r.sources[name] = s
	return s
}

// State returns the desired state: every valid change so far.
func (r *Runner) State() *State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b.State()
}

// Applied returns the last state the proxier applied, without the
// services it left out, or nil.
func (r *Runner) Applied() *State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.applied
}

// WaitSynced waits until the Runner's first successful sync, which comes
// once every source has delivered its initial contents, and returns nil;
// or until ctx ends, and returns its error.
func (r *Runner) WaitSynced(ctx context.Context) error {
	select {
	case <-r.firstSync:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Synced returns a channel closed by the Runner's first successful sync.
func (r *Runner) Synced() <-chan struct{} { return r.firstSync }

// Health reports queued versus applied changes.
func (r *Runner) Health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Health{
		Ready:     r.succeeded && r.allSynced(),
		QueuedAt:  r.pend.queuedAt,
		AppliedAt: r.appliedAt,
		Pending:   len(r.pend.dirty) + len(r.inflight.dirty),
		LastError: r.lastErr,
		LeftOut:   maps.Clone(r.leftOut),
		Families:  r.familyHealth(),
	}
}

// familyHealth returns the changes waiting in each of the proxier's
// families; r.mu is held.
func (r *Runner) familyHealth() []FamilyHealth {
	out := make([]FamilyHealth, len(r.families))
	for i, f := range r.families {
		j := familyIndex(f)
		out[i] = FamilyHealth{Family: f, QueuedAt: r.pend.famQueued[j], LastQueuedAt: r.famLast[j]}
	}
	return out
}

// familyIndex indexes the Runner's arrays by family.
func familyIndex(f Family) int {
	if f == IPv6 {
		return 1
	}
	return 0
}

// allSynced reports whether at least one source is registered and every
// registered source has delivered its initial contents: before that, a
// sync would apply a state nobody delivered.
func (r *Runner) allSynced() bool {
	if len(r.sources) == 0 {
		return false
	}
	for _, s := range r.sources {
		if !s.synced {
			return false
		}
	}
	return true
}

func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// changeKind says what a change to a service touched: a bit per kind.
type changeKind uint8

const (
	serviceChange changeKind = 1 << iota
	endpointChange
	numKinds = iota
)

// kindOf returns what changed from old to cur, either nil for a service
// absent.
func kindOf(old, cur *entry) changeKind {
	if old == nil || cur == nil {
		k := serviceChange
		if (old != nil && len(old.eps) > 0) || (cur != nil && len(cur.eps) > 0) {
			k |= endpointChange
		}
		return k
	}
	var k changeKind
	if !endpointsEqual(old.eps, cur.eps) {
		k |= endpointChange
	}
	if k == 0 || !reflect.DeepEqual(old.svc, cur.svc) {
		k |= serviceChange
	}
	return k
}

// changed records a change of kind k to the named service, caused at at
// (zero: now), that touched the families fams; r.mu is held.
func (r *Runner) changed(name string, k changeKind, at time.Time, fams familySet) {
	now := r.clock.Now()
	r.pend.mark(name, k)
	for i := range numKinds {
		if k&(1<<i) != 0 {
			r.total[i]++
		}
	}
	if at.IsZero() {
		at = now
	}
	r.pend.addTrigger(name, trigger{at: at, fams: fams})
	r.queue(now, fams)
}

// queue records a change made at now that touched the families fams;
// r.mu is held.
func (r *Runner) queue(now time.Time, fams familySet) {
	r.pend.queue(now, fams)
	for _, f := range Families() {
		if fams.has(f) {
			r.famLast[familyIndex(f)] = now
		}
	}
	r.fresh = true
}

// changeFamilies returns the families a change of kind k from the entry
// old to cur (either nil for a service absent) touched, as kube-proxy's
// proxier of each family takes a change: a family whose endpoints
// changed, and for any other change every family the service is served
// in, before or after.
func changeFamilies(old, cur *entry, k changeKind) familySet {
	var fams familySet
	if k&serviceChange != 0 {
		fams |= old.families() | cur.families()
	}
	if k&endpointChange != 0 {
		for _, f := range Families() {
			if !endpointsEqual(old.endpointsOf(f), cur.endpointsOf(f)) {
				fams |= familyBit(f)
			}
		}
	}
	return fams
}

// families returns the families the service is served in: those of its
// service ports; none for a nil entry.
func (e *entry) families() familySet {
	var fams familySet
	if e != nil {
		for _, sp := range e.ports {
			fams |= familyBit(sp.Family)
		}
	}
	return fams
}

// endpointsOf returns the service's endpoints of family f, in order; nil
// for a nil entry.
func (e *entry) endpointsOf(f Family) []epRec {
	var out []epRec
	if e != nil {
		for _, r := range e.eps {
			if r.family() == f {
				out = append(out, r)
			}
		}
	}
	return out
}

// stats returns the change counts; r.mu is held.
func (r *Runner) stats() ChangeStats {
	return ChangeStats{
		ServicesPending:  r.pend.kinds[0] + r.inflight.kinds[0],
		EndpointsPending: r.pend.kinds[1] + r.inflight.kinds[1],
		Services:         r.total[0],
		Endpoints:        r.total[1],
	}
}

// nextSnap numbers a snapshot of the change counts; r.mu is held.
func (r *Runner) nextSnap() uint64 {
	r.snapSeq++
	return r.snapSeq
}

// reportPending reports snapshot seq of the counts, unless a newer one
// was reported already.
func (r *Runner) reportPending(n int, stats ChangeStats, seq uint64) {
	r.reportMu.Lock()
	defer r.reportMu.Unlock()
	if seq <= r.reported {
		return
	}
	r.reported = seq
	if r.opts.Hooks.Pending != nil {
		r.opts.Hooks.Pending(n)
	}
	if r.opts.Hooks.Changes != nil {
		r.opts.Hooks.Changes(stats)
	}
}

// ErrRunnerStarted: Run was called on a Runner that runs, or ran,
// already.
var ErrRunnerStarted = errors.New("runner started already")

// Run syncs until ctx ends, then returns why it ended
// (context.Cause(ctx): context.Canceled when cancelled). A Runner runs
// once: a second Run returns ErrRunnerStarted at once.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrRunnerStarted
	}
	var l loop
	for ctx.Err() == nil {
		due, ok := r.due(&l)
		if ok && !due.After(r.clock.Now()) {
			r.syncOnce(ctx, &l)
			continue
		}
		r.wait(ctx, &l, due, ok)
	}
	return context.Cause(ctx)
}

// wait waits for a change, for due (if ok), or for ctx to end, and syncs if
// due came first.
func (r *Runner) wait(ctx context.Context, l *loop, due time.Time, ok bool) {
	var fire <-chan time.Time
	if ok {
		timer := r.clock.NewTimer(due.Sub(r.clock.Now()))
		defer timer.Stop()
		fire = timer.C()
	}
	if r.idle != nil {
		r.idle(due, ok)
	}
	select {
	case <-ctx.Done():
	case <-r.wake:
	case <-fire:
		r.syncOnce(ctx, l)
	}
}

// loop is the state of Run's loop.
type loop struct {
	lastStart time.Time
	failures  int
	retryAt   time.Time
	started   bool
}

// due returns when the next sync should start, or false to wait for a change.
func (r *Runner) due(l *loop) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	switch {
	case !r.allSynced():
		return time.Time{}, false
	case !l.started:
		return now, true
	case l.failures > 0:
		if r.fresh {
			return minTime(l.retryAt, l.lastStart.Add(r.opts.MinSyncInterval)), true
		}
		return l.retryAt, true
	case !r.pend.empty():
		return l.lastStart.Add(r.opts.MinSyncInterval), true
	}
	return l.lastStart.Add(r.opts.MaxSyncInterval), true
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (r *Runner) syncOnce(ctx context.Context, l *loop) {
	r.mu.Lock()
	st := r.b.State()
	r.inflight, r.fresh = r.pend.take(), false
	batch := r.inflight
	r.mu.Unlock()

	start := r.clock.Now()
	l.started, l.lastStart = true, start
	rep, err := r.p.Sync(ctx, st)
	if err == nil && rep.Applied == nil {
		err = fmt.Errorf("%s: sync reported neither an error nor the state applied", r.p.Capabilities().Backend)
	}
	leftOut := rep.LeftOut
	if err == nil {
		st = rep.Applied // what the kernel holds
	}
	res := SyncResult{Start: start, Duration: r.clock.Now().Sub(start), Services: len(batch.dirty), QueuedAt: batch.queuedAt,
		Full: rep.Full || !r.succeeded, Err: err}
	res.Families = make([]FamilySync, len(r.families))
	for i, f := range r.families {
		res.Families[i].Family = f
	}
	if err == nil {
		res.Triggered = sortedTimes(batch.triggers, allFamilies)
		for i := range res.Families {
			res.Families[i].Triggered = sortedTimes(batch.triggers, familyBit(res.Families[i].Family))
		}
	}

	r.mu.Lock()
	r.inflight = pending{}
	r.lastErr = err
	changedOut := err == nil && !sameKeys(leftOut, r.leftOut)
	if err == nil {
		r.leftOut = leftOut
	}
	if err == nil {
		if !r.succeeded {
			close(r.firstSync)
		}
		r.applied, r.appliedAt, r.succeeded = st, res.End(), true
		l.failures = 0
	} else {
		r.pend.restore(batch)
		l.failures++
		l.retryAt = start.Add(backoff(r.opts.RetryInterval, r.opts.MaxSyncInterval, l.failures))
	}
	pending, stats, seq := len(r.pend.dirty), r.stats(), r.nextSnap()
	r.mu.Unlock()

	if err != nil {
		r.log.Error("sync failed", "err", err, "services", len(batch.dirty), "failures", l.failures, "retry", l.retryAt.Sub(start))
	} else {
		r.log.Debug("synced", "services", len(batch.dirty), "duration", res.Duration)
	}
	if changedOut && r.opts.Hooks.LeftOut != nil {
		r.opts.Hooks.LeftOut(leftOut)
	}
	if err == nil && r.opts.Hooks.Applied != nil {
		r.opts.Hooks.Applied(st)
	}
	if r.opts.Hooks.Synced != nil {
		r.opts.Hooks.Synced(res)
	}
	r.reportPending(pending, stats, seq)
}

// sortedTimes returns, sorted, the times of m whose changes touched a
// family of fams; every time with allFamilies.
func sortedTimes(m map[string][]trigger, fams familySet) []time.Time {
	var out []time.Time
	for _, ts := range m {
		for _, t := range ts {
			if fams == allFamilies || t.fams&fams != 0 {
				out = append(out, t.at)
			}
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

func sameKeys(a, b map[string]error) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

func backoff(first, limit time.Duration, failures int) time.Duration {
	d := first
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Source is one named feed of services into a Runner, such as a Kubernetes
// informer or a file. A service belongs to the source that first adds it.
// Its methods are safe for concurrent use.
type Source struct {
	r      *Runner
	name   string
	owned  map[string]bool
	synced bool
}

// Name returns the source's name.
func (s *Source) Name() string { return s.name }

// Upsert adds or replaces services. Each valid service is applied; each
// invalid one is left out, its previous version (if any) kept, and its
// error returned, joined with the others.
func (s *Source) Upsert(svcs ...Service) error {
	return s.UpsertTriggered(time.Time{}, svcs...)
}

// UpsertTriggered is Upsert for changes whose cause is known to have
// happened at trigger, upstream of the source: Kubernetes' EndpointSlice
// annotation endpoints.kubernetes.io/last-change-trigger-time, which
// holds when the Pod or Service change behind an endpoint change was
// made. The time is not part of any service: an upsert that changes
// nothing else changes nothing, and neither Diff nor a Proxier ever see
// it. It is reported in the SyncResult.Triggered of the sync that applies
// the changes, so that the network programming latency is measured from
// the cause, not from the change's arrival. A zero trigger means the
// change's arrival, as Upsert.
func (s *Source) UpsertTriggered(trigger time.Time, svcs ...Service) error {
	r := s.r
	r.mu.Lock()
	r.b.seq++ // the batch's claims count as made together
	var errs []error
	for i := range svcs {
		if err := s.upsert(&svcs[i], trigger); err != nil {
			errs = append(errs, err)
		}
	}
	e := r.endBatch()
	r.mu.Unlock()
	r.report(e)
	return errors.Join(errs...)
}

// SetNode changes the node the services are selected and compiled for,
// as when its addresses change (see package nodeaddr): every service is
// compiled again and the next sync, due MinSyncInterval after the last as
// for any change, applies what differs; the node it has already changes
// nothing. A node that is not valid, that a
// present service is not valid on (a node port outside a new range), or
// that the proxier's Capabilities refuse is refused, and changes nothing.
func (r *Runner) SetNode(node NodeConfig) error {
	r.mu.Lock()
	if reflect.DeepEqual(cloneNode(node), r.b.node) {
		r.mu.Unlock()
		return nil // the same node: nothing to sync
	}
	if err := r.b.SetNode(node); err != nil {
		r.mu.Unlock()
		return err
	}
	r.pend.node = true
	r.queue(r.clock.Now(), allFamilies)
	e := r.endBatch()
	r.mu.Unlock()
	r.report(e)
	return nil
}

// batchEnd is what a batch of changes reports, taken under r.mu and
// reported once it is released.
type batchEnd struct {
	pending int
	stats   ChangeStats
	seq     uint64
	// clashes, when changed, are the frontend clashes now.
	changed bool
	clashes []Conflict
}

// endBatch takes what a batch of changes reports; r.mu is held.
func (r *Runner) endBatch() batchEnd {
	e := batchEnd{pending: len(r.pend.dirty) + len(r.inflight.dirty), stats: r.stats(), seq: r.nextSnap()}
	if e.changed = r.b.clashVer != r.clashVer; e.changed {
		r.clashVer, e.clashes = r.b.clashVer, r.b.Conflicts()
	}
	return e
}

// report reports what endBatch took, and wakes Run; r.mu is not held.
func (r *Runner) report(e batchEnd) {
	r.reportPending(e.pending, e.stats, e.seq)
	if e.changed {
		clashes := e.clashes
		for _, c := range clashes {
			r.log.Warn("frontend asked for by several services", "frontend", c.Frontend, "held by", c.Winner, "not served for", c.Losers)
		}
		if r.opts.Hooks.Conflicts != nil {
			r.opts.Hooks.Conflicts(clashes)
		}
	}
	r.poke()
}

func (s *Source) upsert(svc *Service, at time.Time) error {
	r := s.r
	if o, ok := r.owner[svc.Name]; ok && o != s {
		return &ValidationError{Service: svc.Name, Field: "name", Err: fmt.Errorf("%w %q", ErrSourceConflict, o.name)}
	}
	before := r.b.w.get(svc.Name)
	changed, err := r.b.upsert(*svc)
	if err != nil {
		return err
	}
	for _, name := range changed {
		cur := r.b.w.get(name)
		k, fams := serviceChange, cur.families()
		if name == svc.Name {
			k = kindOf(before, cur)
			fams = changeFamilies(before, cur, k)
		}
		r.changed(name, k, at, fams)
	}
	r.owner[svc.Name], s.owned[svc.Name] = s, true
	return nil
}

// Delete removes services by name. Names the source does not own are
// ignored if nobody owns them, and an error if another source does.
func (s *Source) Delete(names ...string) error {
	r := s.r
	r.mu.Lock()
	var errs []error
	for _, n := range names {
		if err := s.delete(n); err != nil {
			errs = append(errs, err)
		}
	}
	e := r.endBatch()
	r.mu.Unlock()
	r.report(e)
	return errors.Join(errs...)
}

func (s *Source) delete(name string) error {
	r := s.r
	if o, ok := r.owner[name]; ok && o != s {
		return &ValidationError{Service: name, Field: "name", Err: fmt.Errorf("%w %q", ErrSourceConflict, o.name)}
	}
	before := r.b.w.get(name)
	if others, ok := r.b.delete(name); ok {
		k := kindOf(before, nil)
		r.changed(name, k, time.Time{}, changeFamilies(before, nil, k))
		for _, o := range others {
			r.changed(o, serviceChange, time.Time{}, r.b.w.get(o).families())
		}
	}
	delete(r.owner, name)
	delete(s.owned, name)
	return nil
}

// Replace makes svcs the source's whole contents: services it owns that are
// not in svcs are deleted, and the rest upserted, as Upsert does.
func (s *Source) Replace(svcs []Service) error {
	r := s.r
	r.mu.Lock()
	r.b.seq++ // the batch's claims count as made together
	keep := make(map[string]bool, len(svcs))
	for i := range svcs {
		keep[svcs[i].Name] = true
	}
	var errs []error
	for name := range s.owned {
		if !keep[name] {
			errs = append(errs, s.delete(name))
		}
	}
	for i := range svcs {
		errs = append(errs, s.upsert(&svcs[i], time.Time{}))
	}
	e := r.endBatch()
	r.mu.Unlock()
	r.report(e)
	return errors.Join(errs...)
}

// Synced reports that the source has delivered its initial contents.
func (s *Source) Synced() {
	s.r.mu.Lock()
	s.synced = true
	s.r.mu.Unlock()
	s.r.poke()
}
