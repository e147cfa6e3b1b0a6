// Package syncer is the part of Sync that every kproxy dataplane shares:
// which kind of sync to run, when to look at the kernel and how deeply,
// how to retry a sync that lost a race with another writer, how to keep
// and retry the deletion of stale conntrack flows, and what to log. A
// backend implements Backend, the part that knows its kernel objects, and
// runs an Engine, so that every backend behaves alike in the situations a
// node proxy meets in production: a restart, another writer on the same
// tables, someone deleting what it owns, a conntrack deletion that fails.
//
// # One sync
//
// The first Sync of an Engine writes the whole state (Backend.Write), which
// adopts what the kernel holds. Every later Sync first checks cheaply that
// the kernel still holds what was written (Backend.Check: a generation
// number, a few counters), and compares in depth (Backend.Verify) when the
// state has not changed (the caller's periodic sync, whose only purpose is
// to look) and otherwise at most every VerifyInterval, so that drift is
// repaired by the next periodic sync even while changes keep coming; a
// difference found either way makes the sync write the whole state again,
// repairing it. A backend's Verify reads nothing when no one committed
// since its last verify. Otherwise the sync applies
// servicelb.Diff of the last state applied and the new one
// (Backend.Apply); an unchanged state sends nothing. A change the kernel
// refuses because someone else removed or added what it touches (ENOENT,
// EEXIST) is taken as drift and repaired by a whole write in the same Sync.
// A sync that writes the whole state, or tries to, says so in its report
// (servicelb.SyncReport.Full), for the Runner's metrics.
//
// A step that lost a race with another writer of the same netfilter
// tables (Options.Retryable: a dump interrupted by a commit, a commit that
// found the ruleset generation moved) is retried at once within the same
// Sync, up to Options.Attempts times with a short growing pause (a few
// milliseconds, 127 ms in all by default), so that a busy firewall manager
// on the node does not turn into failed syncs and the caller's backoff. A
// deep verify that keeps losing races is put off to the next Sync rather
// than failing this one.
//
// # Stale flows
//
// After a successful sync the Engine deletes the conntrack flows the sync
// left stale (servicelb.StaleFlow) through Options.Cleaner: the frontends
// the changes touched, and after a whole write every UDP and SCTP frontend
// of the state, which reconciles the whole table (as after a restart). The
// filters stay pending, one per frontend, until a deletion succeeds; each
// later sync brings the pending filters of the frontends it touches up to
// date, so a retried deletion never cuts the flows of an endpoint that
// serves again. A failed deletion fails the Sync after the kernel state is
// applied: the error says so.
//
// # Services left out
//
// When the backend refuses a sync with errors that each name a service
// (servicelb.ServicesOf: a capability it lacks, more than it can hold, a
// frontend someone else holds in the kernel), or the kernel refuses it and
// the backend traces every part of the refusal to ports of services the
// state has (Options.Traced: the messages of a batch written for them;
// see Refused), the Engine syncs again without those services, in the
// same Sync: one service never keeps the others from the kernel. A
// refusal of the whole write that follows a change taken for drift counts
// as well; one that touches anything of no service port (the table, the
// base chains, a shared set), or the objects of a service the state no
// longer has, fails the Sync as before. Sync then reports the services
// left out (servicelb.SyncReport.LeftOut) and the state applied without
// them (State.Without, which leaves every other service as it is), so
// that nobody works it out again. A service left out stays out, without
// being tried, until it changes or goes; while it is out, a sync costs
// what changed and the services left out, not a walk of every service.
//
// # Errors
//
// A failed Sync's error starts with the backend's name (Options.Name) and
// "sync:", once: what the Backend's methods return names no backend, so
// that the name is never repeated. A validation error is returned as it
// is: it names its service and field. A backend's other public methods
// (New, Cleanup) start their errors with its name themselves, and callers
// add none.
package syncer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Backend is what a dataplane implements for an Engine. The Engine calls
// it with its caller's lock held, one call at a time.
type Backend interface {
	// Check reports cheaply whether the kernel still holds what the
	// backend last wrote or applied.
	Check(ctx context.Context) (bool, error)
	// Verify compares the kernel with what the backend last wrote or
	// applied, in depth, and reports whether they match.
	Verify(ctx context.Context) (bool, error)
	// Write makes the kernel hold st, whatever it holds now.
	Write(ctx context.Context, st *servicelb.State) error
	// Apply applies ch, the changes from the state last written or
	// applied to st. It reports full when it wrote the whole state
	// instead.
	Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (full bool, err error)
}

// Defaults.
const (
	DefaultVerifyInterval = time.Minute
	DefaultAttempts       = 8
)

// Options configure an Engine.
type Options struct {
	// Name is the backend's name, as errors and logs start it.
	Name string
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
	// Cleaner deletes stale conntrack flows; nil turns the cleanup off.
	Cleaner conntrack.FlowCleaner
	// VerifyInterval is the least time between two deep verifies of the
	// kernel (Backend.Verify) by syncs that change something; a sync that
	// changes nothing verifies in depth. Default DefaultVerifyInterval.
	VerifyInterval time.Duration
	// Attempts bounds the attempts at one Sync that loses races with
	// other writers; default DefaultAttempts.
	Attempts int
	// Retryable tells the errors of a lost race.
	Retryable func(error) bool
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Capabilities are the backend's: a state whose node they refuse
	// (servicelb.Capabilities.CheckNode) fails the sync before anything
	// is sent.
	Capabilities servicelb.Capabilities
	// Traced, when set, finds in an error of the kernel the service port
	// each refused part of it belongs to, with that part's error; nil
	// when some part belongs to none. Such services are left out as
	// those the backend refuses (see Refused).
	Traced func(error) map[servicelb.ServicePortKey]error
	// After, when set, runs after each sync that applied the state (whole
	// or leaving services out), before the stale flows are deleted: the
	// backend's own follow-up, such as draining removed servers. Its
	// error joins Sync's.
	After func(context.Context) error
}

// Engine runs a Backend's syncs. It is not safe for concurrent use: the
// Proxier that owns it serialises its calls.
type Engine struct {
	b   Backend
	o   Options
	log *slog.Logger

	applied    *servicelb.State
	pending    pendingFlows
	lastVerify time.Time
	closed     bool
	// leftOut are the services a sync left out, each with the version
	// refused and its error, until they change.
	leftOut map[string]leftOut
}

type leftOut struct {
	// ports are the service's ports when it was left out: a State keeps
	// them, the same values, until the service changes.
	ports []*servicelb.ServicePort
	err   error
}

// New returns an Engine for b.
func New(b Backend, o Options) *Engine {
	if o.VerifyInterval == 0 {
		o.VerifyInterval = DefaultVerifyInterval
	}
	if o.Attempts == 0 {
		o.Attempts = DefaultAttempts
	}
	if o.Retryable == nil {
		o.Retryable = func(error) bool { return false }
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Engine{b: b, o: o, log: log}
}

// Applied returns the last state applied, or nil before the first sync
// and after Forget.
func (e *Engine) Applied() *servicelb.State { return e.applied }

// Explained returns the service port of the last state applied that the
// flow ex explains hits, for a backend that reads back what serves it
// (servicelb.FlowChecker): nil and "" for a flow that hits none, nil and
// the difference when ex is not of the state applied (nothing applied
// yet, or the port is not applied as ex has it).
func (e *Engine) Explained(ex *servicelb.Explanation) (*servicelb.ServicePort, string) {
	switch {
	case e.applied == nil:
		return nil, "no state applied yet: the kernel holds nothing of the proxier's"
	case ex.Port == nil:
		return nil, ""
	}
	sp := e.applied.Port(ex.Port.Key)
	switch {
	case sp == nil:
		return nil, fmt.Sprintf("service port %s is not in the state applied: the explanation is of another state than the one applied", ex.Port.Key)
	case !sp.Equal(ex.Port):
		return nil, fmt.Sprintf("service port %s is applied as %s, the explanation has it as %s: the explanation is of another state than the one applied",
			ex.Port.Key, sp, ex.Port)
	}
	return sp, ""
}

// Forget makes the next Sync write the whole state, with no pending stale
// flows: for after a Cleanup.
func (e *Engine) Forget() {
	e.applied = nil
	e.pending.clear()
	e.lastVerify = time.Time{}
	e.leftOut = nil
}

// Close makes every later Sync fail with servicelb.ErrClosed.
func (e *Engine) Close() { e.closed = true }

// Closed reports whether Close was called.
func (e *Engine) Closed() bool { return e.closed }

// Sync makes the kernel hold st. See the package documentation.
func (e *Engine) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	if err := st.Check(); err != nil {
		return servicelb.SyncReport{}, e.wrap(err)
	}
	if e.closed {
		return servicelb.SyncReport{}, e.wrap(servicelb.ErrClosed)
	}
	node := st.Node()
	if err := e.o.Capabilities.CheckNode(&node); err != nil {
		return servicelb.SyncReport{}, err
	}
	start := e.o.Now()
	var full bool
	var ch servicelb.Changes
	eff := e.exclude(st)
	err := e.retry(ctx, func() (err error) {
		full, ch, err = e.once(ctx, eff)
		return err
	})
	for round := 0; err != nil && round < maxLeaveOutRounds; round++ {
		bad := e.refusedServices(st, err)
		if bad == nil {
			break
		}
		e.leaveOut(st, bad)
		eff = e.exclude(st)
		err = e.retry(ctx, func() (err error) {
			full, ch, err = e.once(ctx, eff)
			return err
		})
	}
	rep := servicelb.SyncReport{Full: full}
	if err != nil {
		return rep, e.wrap(err)
	}
	rep.Applied, rep.LeftOut = eff, e.leftOutErrors()
	e.queueFlows(eff, &ch, full)
	e.log.Debug("synced", "services", eff.Len(), "changed", ch.Len(), "full", full, "duration", e.o.Now().Sub(start))
	var after error
	if e.o.After != nil {
		after = e.o.After(ctx)
	}
	return rep, errors.Join(after, e.deleteFlows(ctx))
}

// maxLeaveOutRounds bounds the syncs tried in one Sync, each leaving out
// the services the one before was refused for.
const maxLeaveOutRounds = 3

// refusedServices returns the services err names, each with its part of
// it: those a backend refused (servicelb.ServicesOf), or those of st
// whose ports the kernel refused (Options.Traced); nil when some part of
// err is about no service, or about a service st no longer has (the
// removal of its objects, which leaving it out would not help).
func (e *Engine) refusedServices(st *servicelb.State, err error) map[string]error {
	if bad := servicelb.ServicesOf(err); bad != nil || e.o.Traced == nil {
		return bad
	}
	ports := e.o.Traced(err)
	if len(ports) == 0 {
		return nil
	}
	bad := map[string]error{}
	for _, k := range slices.SortedFunc(maps.Keys(ports), servicelb.ServicePortKey.Compare) {
		if _, ok := st.Service(k.Service); !ok {
			return nil
		}
		bad[k.Service] = errors.Join(bad[k.Service], Refused(k, ports[k]))
	}
	return bad
}

// Refused is the error of a service port whose kernel objects the kernel
// refused: a *servicelb.ValidationError naming the service and the port,
// wrapping servicelb.ErrRefused and the kernel's error. An Engine leaves
// out the services of such errors, as it does those a capability
// refuses.
func Refused(k servicelb.ServicePortKey, err error) error {
	return &servicelb.ValidationError{Service: k.Service, Field: "ports", Value: k.String(),
		Err: fmt.Errorf("%w: %w", servicelb.ErrRefused, err)}
}

// leaveOut records services refused with their errors.
func (e *Engine) leaveOut(st *servicelb.State, bad map[string]error) {
	if e.leftOut == nil {
		e.leftOut = map[string]leftOut{}
	}
	for name, err := range bad {
		if _, was := e.leftOut[name]; !was {
			e.log.Warn("service left out: the backend or the kernel refuses it; the rest is applied", "service", name, "err", err)
		}
		e.leftOut[name] = leftOut{ports: st.ServicePorts(name), err: err}
	}
}

// exclude forgets the services left out that st no longer has or has
// changed (so that they are tried again) and returns st without the
// others (State.Without: it costs the services left out, not all).
func (e *Engine) exclude(st *servicelb.State) *servicelb.State {
	var names []string
	for name, lo := range e.leftOut {
		if _, ok := st.Service(name); !ok || !slices.Equal(st.ServicePorts(name), lo.ports) {
			delete(e.leftOut, name)
			continue
		}
		names = append(names, name)
	}
	return st.Without(names...)
}

// leftOutErrors returns the services left out with their errors, or nil.
func (e *Engine) leftOutErrors() map[string]error {
	if len(e.leftOut) == 0 {
		return nil
	}
	out := make(map[string]error, len(e.leftOut))
	for name, lo := range e.leftOut {
		out[name] = lo.err
	}
	return out
}

// wrap starts an error with the backend's name, unless it is a
// validation error, which names its service and field itself.
func (e *Engine) wrap(err error) error {
	var ve *servicelb.ValidationError
	if errors.As(err, &ve) {
		return err
	}
	return privilege.Check(fmt.Errorf("%s: sync: %w", e.o.Name, err))
}

// once is one attempt at a sync.
func (e *Engine) once(ctx context.Context, st *servicelb.State) (bool, servicelb.Changes, error) {
	if e.applied == nil {
		return true, servicelb.Changes{}, e.write(ctx, st, "")
	}
	ch := servicelb.Diff(e.applied, st)
	why, err := e.drift(ctx, ch.Empty())
	if err != nil {
		return false, servicelb.Changes{}, err
	}
	if why != "" {
		return true, servicelb.Changes{}, e.write(ctx, st, why)
	}
	if ch.Empty() {
		return false, ch, nil
	}
	full, err := e.b.Apply(ctx, st, &ch)
	if isDrift(err) {
		return true, ch, e.write(ctx, st, fmt.Sprintf("the kernel refused a change: %v", err))
	}
	if err != nil {
		return false, ch, err
	}
	e.applied = st
	return full, ch, nil
}

// drift checks the kernel, cheaply and, when due or when the sync has
// nothing to change (deep), in depth, and says what differs, or "".
func (e *Engine) drift(ctx context.Context, deep bool) (string, error) {
	ok, err := e.b.Check(ctx)
	if err != nil || !ok {
		return "changed by someone else", err
	}
	if !deep && e.o.Now().Sub(e.lastVerify) < e.o.VerifyInterval {
		return "", nil
	}
	ok, err = e.b.Verify(ctx)
	switch {
	case err != nil && e.o.Retryable(err):
		e.log.Debug("deep verify lost a race with another writer; put off to the next sync", "err", err)
		return "", nil
	case err != nil:
		return "", err
	case !ok:
		return "found different by a deep verify", nil
	}
	e.lastVerify = e.o.Now()
	return "", nil
}

// write writes the whole state; why says why, "" for a first sync.
func (e *Engine) write(ctx context.Context, st *servicelb.State, why string) error {
	if err := e.b.Write(ctx, st); err != nil {
		return err
	}
	if why == "" {
		e.log.Info("state written", "services", st.Len())
	} else {
		e.log.Info("kernel state repaired", "why", why, "services", st.Len())
	}
	e.applied, e.lastVerify = st, e.o.Now()
	return nil
}

// isDrift reports whether the kernel refused a change because what it
// touches is not as the backend left it.
func isDrift(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EEXIST)
}

// retry runs f until it succeeds, fails otherwise than by a lost race, or
// has run Attempts times, pausing 1, 2, 4 ... 64 ms between attempts.
func (e *Engine) retry(ctx context.Context, f func() error) error {
	var err error
	for i := range e.o.Attempts {
		if err = f(); err == nil || !e.o.Retryable(err) {
			return err
		}
		e.log.Debug("sync lost a race with another writer; retrying", "attempt", i+1, "err", err)
		if i == e.o.Attempts-1 {
			break
		}
		t := time.NewTimer(time.Millisecond << min(i, 6))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
	return fmt.Errorf("%w (after %d attempts)", err, e.o.Attempts)
}

// queueFlows records the stale-flow filters a successful sync calls for.
func (e *Engine) queueFlows(st *servicelb.State, ch *servicelb.Changes, full bool) {
	if e.o.Cleaner == nil {
		return
	}
	if full {
		e.pending.reset(st)
		return
	}
	e.pending.refresh(ch)
	e.pending.add(ch.StaleFlows())
}

// deleteFlows deletes the flows the pending filters select; the filters
// stay pending until a deletion succeeds.
func (e *Engine) deleteFlows(ctx context.Context) error {
	if e.pending.empty() {
		return nil
	}
	fs := e.pending.list()
	n, err := e.o.Cleaner.DeleteStale(ctx, fs)
	if err != nil {
		return fmt.Errorf("%s: sync applied; deleting the stale flows of %d frontends, retried on the next sync: %w", e.o.Name, len(fs), err)
	}
	e.pending.clear()
	e.log.Debug("deleted stale flows", "frontends", len(fs), "flows", n)
	return nil
}
