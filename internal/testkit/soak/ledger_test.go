package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// faultKind names a kind of fault.
type faultKind string

// The kinds of faults. See the package documentation.
const (
	faultFlush         faultKind = "flush"
	faultDeleteChain   faultKind = "delete-chain"
	faultDeleteElement faultKind = "delete-element"
	faultDormant       faultKind = "dormant"
	faultForeignWriter faultKind = "foreign-writer"
	faultRestart       faultKind = "restart"
)

// What failed.
const (
	whatAsk     = "ask"     // a fresh connection to port 80
	whatSession = "session" // a line not echoed on a session to port 81
	whatConnect = "connect" // a session that could not be opened
)

// failure is one failed ask, session check or session connect.
type failure struct {
	what       string
	start, end time.Time
	svc        int
	// endpoint is the backend host a session reached; empty for asks and
	// connects.
	endpoint string
	// removed says that the session's endpoint left its service at most
	// removedGrace before the failure.
	removed bool
	err     string
}

// fault is one fault made. A destructive one has a window: from at until
// closed, which stays zero while it is open.
type fault struct {
	kind        faultKind
	detail      string
	at          time.Time
	destructive bool
	// repairedAt is when a probe first saw the kernel repaired; zero if
	// it never did.
	repairedAt time.Time
	closed     time.Time
	unrepaired bool
}

// meets reports whether the failure's time span meets the fault's
// window.
func (f *fault) meets(fl failure) bool {
	return f.destructive && !fl.end.Before(f.at) && !fl.start.After(f.windowEnd())
}

// windowEnd is when the fault's window closes: 2 s after the first
// successful sync after its repair, or when it was found unrepaired. A
// window still open (a repair no sync has followed yet) ends where an
// unrepaired fault's would, so that no window excuses the failures of the
// rest of the run.
func (f *fault) windowEnd() time.Time {
	last := f.at.Add(repairTimeout + windowTail)
	if f.closed.IsZero() || f.closed.After(last) {
		return last
	}
	return f.closed
}

// sample is one measure of a proxier process.
type sample struct {
	at         time.Time
	rssKiB     int
	goroutines int
	heapLive   uint64 // bytes, as the last garbage collection found them
}

// life is one proxier process's.
type life struct {
	born, died time.Time
	synced     bool // a sync succeeded
	samples    []sample
}

// syncErrorsKept bounds the distinct sync errors the report lists.
const syncErrorsKept = 5

// ledger records what the soak saw, for the verdict and the report. Its
// methods are safe for concurrent use.
type ledger struct {
	mu    sync.Mutex
	start time.Time

	attempts, ok, firstOK, full int
	// latencies are the network programming latencies of the successful
	// syncs that applied changes: from the oldest change to the end.
	latencies []time.Duration
	// retrying marks the processes whose last sync failed: their next
	// success is not at the first attempt.
	retrying   map[int]bool
	syncErrors map[string]int

	faults   []*fault
	failures []failure
	asks     int
	checks   int
	lives    map[int]*life
	restarts int
	errs     []string
}

func newLedger() *ledger {
	return &ledger{retrying: map[int]bool{}, syncErrors: map[string]int{}, lives: map[int]*life{}, start: time.Now()}
}

// begin marks the start of the soak proper, from which times count.
func (l *ledger) begin(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start = at
}

// since formats at as the time since the start.
func (l *ledger) since(at time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sinceLocked(at)
}

func (l *ledger) sinceLocked(at time.Time) string {
	return "+" + at.Sub(l.start).Round(100*time.Millisecond).String()
}

// errorf records a failure of the soak that is no failed connection.
func (l *ledger) errorf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Sprintf(format, args...))
}

func (l *ledger) born(id int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lives[id] = &life{born: at}
}

func (l *ledger) died(id int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lives[id].died = at
}

func (l *ledger) restarted() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.restarts++
}

func (l *ledger) sample(id int, s sample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lives[id].samples = append(l.lives[id].samples, s)
}

// synced records a sync attempt of proxier id, reported at now, and
// reports whether it is the process's first success. A success closes
// the windows of the faults seen repaired before it.
func (l *ledger) synced(id int, now time.Time, ev event) (first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	if ev.Err != "" {
		l.retrying[id] = true
		if len(l.syncErrors) < syncErrorsKept || l.syncErrors[ev.Err] > 0 {
			l.syncErrors[ev.Err]++
		}
		return false
	}
	l.ok++
	if ev.Full {
		l.full++
	}
	if !ev.QueuedAt.IsZero() {
		l.latencies = append(l.latencies, ev.Start.Add(ev.Duration).Sub(ev.QueuedAt))
	}
	lf := l.lives[id]
	first = lf != nil && !lf.synced
	if lf != nil {
		lf.synced = true
	}
	if !l.retrying[id] {
		l.firstOK++
	}
	l.retrying[id] = false
	for _, f := range l.faults {
		if f.destructive && !f.repairedAt.IsZero() && f.closed.IsZero() {
			f.closed = now.Add(windowTail)
		}
	}
	return first
}

// note records a fault without a window.
func (l *ledger) note(kind faultKind, at time.Time, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = append(l.faults, &fault{kind: kind, at: at, detail: detail})
}

// opened records a destructive fault made at at, and opens its window.
func (l *ledger) opened(kind faultKind, at time.Time, detail string) *fault {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := &fault{kind: kind, at: at, detail: detail, destructive: true}
	l.faults = append(l.faults, f)
	return f
}

// repaired records that f was seen repaired at at; the next successful
// sync closes its window.
func (l *ledger) repaired(f *fault, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f.repairedAt = at
}

// unrepaired records that f was still not repaired at at, and closes its
// window there.
func (l *ledger) unrepaired(f *fault, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f.unrepaired, f.closed = true, at
}

func (l *ledger) asked() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asks++
}

func (l *ledger) checked() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checks++
}

func (l *ledger) failed(f failure) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, f)
}

// progress returns a line of figures so far.
func (l *ledger) progress(now time.Time, changes int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	rss := "?"
	if len(l.lives) > 0 {
		if s := l.lives[slices.Max(slices.Collect(maps.Keys(l.lives)))].samples; len(s) > 0 {
			rss = fmt.Sprintf("%.1f MiB", mib(s[len(s)-1].rssKiB))
		}
	}
	return fmt.Sprintf("%s: changes %d, syncs %d/%d ok, asks %d, checks %d, failures %d, faults %d, restarts %d, proxier RSS %s",
		l.sinceLocked(now), changes, l.ok, l.attempts, l.asks, l.checks, len(l.failures), len(l.faults), l.restarts, rss)
}

func mib(kib int) float64 { return float64(kib) / 1024 }

// reportInput is what the report needs besides the ledger.
type reportInput struct {
	backend             string
	seed                uint64
	duration            time.Duration
	services, endpoints int
	changes             int
	kinds               []faultKind
	equal               bool
	limits              growthLimits
}

// growthLimits bound the growth of the longest-lived proxier process,
// per hour, over its samples after its first minute: beyond them the
// soak fails.
type growthLimits struct {
	rssMiB     float64 // resident set size, MiB an hour
	goroutines float64 // goroutines an hour
}

// report is the summary of a soak, and what fails it.
type report struct {
	text   string
	errors []string
}

// tally sorts the failures out. Two kinds of failure are excused, and
// no other: one inside the repair window of a fault the soak injected,
// and a session's whose endpoint had just left its service. Every other
// failure is real.
type tally struct {
	// byFault holds the failures in each fault's window, and windowed
	// lists them in the order they happened.
	byFault  map[*fault][]failure
	windowed []failure
	inWindow map[string]int // by what
	// removed are the session failures outside every window whose
	// endpoint had just left its service.
	removed []failure
	real    []failure
	failed  map[string]int
}

// sortFailures attributes each failure to the latest of the faults whose
// windows it meets (where windows overlap, the fault made last is the
// likelier cause); a session failure outside every window whose endpoint
// had just left its service is excused; the rest are real.
func (l *ledger) sortFailures() tally {
	t := tally{byFault: map[*fault][]failure{}, inWindow: map[string]int{}, failed: map[string]int{}}
	for _, fl := range l.failures {
		t.failed[fl.what]++
		i := latestIndex(l.faults, func(f *fault) bool { return f.meets(fl) })
		switch {
		case i >= 0:
			t.byFault[l.faults[i]] = append(t.byFault[l.faults[i]], fl)
			t.windowed = append(t.windowed, fl)
			t.inWindow[fl.what]++
		case fl.what == whatSession && fl.removed:
			t.removed = append(t.removed, fl)
		default:
			t.real = append(t.real, fl)
		}
	}
	return t
}

// excusedListed bounds the excused failures the report lists of each
// kind.
const excusedListed = 10

// latestIndex returns the index of the last fault that matches, or -1.
// The ledger keeps faults in the order they were made.
func latestIndex(faults []*fault, match func(*fault) bool) int {
	for i := len(faults) - 1; i >= 0; i-- {
		if match(faults[i]) {
			return i
		}
	}
	return -1
}

// report writes the summary and lists what fails the soak.
func (l *ledger) report(in reportInput) report {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.sortFailures()
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "backend\t%s (seed %d)\n", in.backend, in.seed)
	fmt.Fprintf(w, "duration\t%v\n", in.duration.Round(time.Second))
	fmt.Fprintf(w, "services\t%d x %d endpoints\n", in.services, in.endpoints)
	fmt.Fprintf(w, "changes sent\t%d (%.1f/s)\n", in.changes, float64(in.changes)/in.duration.Seconds())
	fmt.Fprintf(w, "syncs\tattempts %d, ok %d (%s), ok at the first attempt %s; %d wrote the whole state\n",
		l.attempts, l.ok, percent(l.ok, l.attempts), percent(l.firstOK, l.ok), l.full)
	for _, e := range slices.Sorted(maps.Keys(l.syncErrors)) {
		fmt.Fprintf(w, "  sync error\t%dx %s\n", l.syncErrors[e], e)
	}
	if len(l.latencies) > 0 {
		lat := slices.Sorted(slices.Values(l.latencies))
		q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(time.Millisecond) }
		fmt.Fprintf(w, "programming latency\tmedian %v, p99 %v, max %v (from the oldest change a sync applied to its end)\n", q(0.5), q(0.99), q(1))
	}
	fmt.Fprintf(w, "asks\t%d, failed %d: %d in fault windows, %d outside\n",
		l.asks, t.failed[whatAsk], t.inWindow[whatAsk], t.failed[whatAsk]-t.inWindow[whatAsk])
	fmt.Fprintf(w, "session checks\t%d, failed %d: %d in fault windows, %d excused (endpoint removed within %v), %d outside\n",
		l.checks, t.failed[whatSession], t.inWindow[whatSession], len(t.removed), removedGrace,
		t.failed[whatSession]-t.inWindow[whatSession]-len(t.removed))
	fmt.Fprintf(w, "session connects\tfailed %d: %d in fault windows, %d outside\n",
		t.failed[whatConnect], t.inWindow[whatConnect], t.failed[whatConnect]-t.inWindow[whatConnect])
	w.Flush()
	l.writeFaults(&b, in.kinds, t)
	w = tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "proxier restarts\t%d\n", l.restarts)
	g := l.growth()
	g.write(w, in.limits)
	fmt.Fprintf(w, "final state\t%s\n", map[bool]string{true: "equal to a fresh apply: yes", false: "equal to a fresh apply: NO"}[in.equal])
	w.Flush()
	l.writeExcused(&b, t)
	errs := g.exceeded(in.limits)
	if len(t.real) > 0 {
		fmt.Fprintf(&b, "real failures (%d):\n", len(t.real))
		for _, fl := range t.real {
			fmt.Fprintf(&b, "  %s\n", l.describe(fl))
		}
		errs = append(errs, fmt.Sprintf("%d failures outside every fault window (listed in the report)", len(t.real)))
	}
	for _, f := range l.faults {
		if f.unrepaired {
			errs = append(errs, fmt.Sprintf("fault %s at %s (%s) not repaired within %v", f.kind, l.sinceLocked(f.at), f.detail, repairTimeout))
		}
	}
	if !in.equal {
		errs = append(errs, "the final kernel state differs from a fresh apply of the same state")
	}
	if l.ok == 0 {
		errs = append(errs, "no sync succeeded")
	}
	errs = append(errs, l.errs...)
	return report{text: b.String(), errors: errs}
}

// writeFaults writes the table of faults by kind.
func (l *ledger) writeFaults(b *strings.Builder, kinds []faultKind, t tally) {
	w := tabwriter.NewWriter(b, 0, 8, 2, ' ', 0)
	fmt.Fprintf(w, "faults\tcount\tfailures\tlongest repair\tlongest outage\t\n")
	for _, k := range kinds {
		var count, failures int
		var repair, outage time.Duration
		for _, f := range l.faults {
			if f.kind != k {
				continue
			}
			count++
			if !f.destructive {
				continue
			}
			fls := t.byFault[f]
			failures += len(fls)
			if f.unrepaired {
				repair = max(repair, repairTimeout)
			} else if !f.repairedAt.IsZero() {
				repair = max(repair, f.repairedAt.Sub(f.at))
			}
			for _, fl := range fls {
				outage = max(outage, fl.end.Sub(f.at))
			}
		}
		if k == faultForeignWriter || k == faultRestart {
			fmt.Fprintf(w, "  %s\t%d\t-\t-\t-\t\n", k, count)
			continue
		}
		fmt.Fprintf(w, "  %s\t%d\t%d\t%v\t%v\t\n", k, count, failures, repair.Round(100*time.Millisecond), outage.Round(100*time.Millisecond))
	}
	w.Flush()
	if !slices.Contains(kinds, faultDormant) {
		b.WriteString("  (no dormant table: this backend leaves the flags of the tables it shares alone)\n")
	}
}

// writeExcused lists the excused failures apart from the real ones, by
// why each is excused: inside a fault's window (with the fault), or a
// session whose endpoint had just left its service.
func (l *ledger) writeExcused(b *strings.Builder, t tally) {
	if len(t.windowed)+len(t.removed) == 0 {
		return
	}
	fmt.Fprintf(b, "excused failures (%d): %d inside an injected fault's repair window, %d of sessions whose endpoint left its service within %v before\n",
		len(t.windowed)+len(t.removed), len(t.windowed), len(t.removed), removedGrace)
	if len(t.windowed) > 0 {
		fmt.Fprintf(b, "  in fault windows:\n")
		for _, fl := range t.windowed[:min(len(t.windowed), excusedListed)] {
			f := l.faults[latestIndex(l.faults, func(f *fault) bool { return f.meets(fl) })]
			fmt.Fprintf(b, "    %s [fault %s at %s]\n", l.describe(fl), f.kind, l.sinceLocked(f.at))
		}
		if n := len(t.windowed) - excusedListed; n > 0 {
			fmt.Fprintf(b, "    and %d more\n", n)
		}
	}
	if len(t.removed) > 0 {
		fmt.Fprintf(b, "  endpoint removed just before:\n")
		for _, fl := range t.removed[:min(len(t.removed), excusedListed)] {
			fmt.Fprintf(b, "    %s\n", l.describe(fl))
		}
		if n := len(t.removed) - excusedListed; n > 0 {
			fmt.Fprintf(b, "    and %d more\n", n)
		}
	}
}

// growth is the growth of the longest-lived proxier process over its
// samples after its first minute.
type growth struct {
	id                                  int
	lived                               time.Duration
	used                                []sample
	span                                time.Duration // from the first sample used to the last
	rss                                 []float64     // MiB
	heap                                []float64     // MiB
	rssSlope, heapSlope, goroutineSlope float64       // per hour
}

// growth measures the longest-lived proxier process.
func (l *ledger) growth() growth {
	now := time.Now()
	lived := func(lf *life) time.Duration {
		if lf.died.IsZero() {
			return now.Sub(lf.born)
		}
		return lf.died.Sub(lf.born)
	}
	var best *life
	var g growth
	for _, id := range slices.Sorted(maps.Keys(l.lives)) {
		if lf := l.lives[id]; best == nil || lived(lf) > lived(best) {
			best, g.id = lf, id
		}
	}
	if best == nil {
		return g
	}
	g.lived = lived(best).Round(time.Second)
	var xs, gs []float64
	for _, s := range best.samples {
		if s.at.Sub(best.born) >= time.Minute {
			g.used = append(g.used, s)
			xs = append(xs, s.at.Sub(best.born).Hours())
			g.rss = append(g.rss, mib(s.rssKiB))
			g.heap = append(g.heap, float64(s.heapLive)/(1<<20))
			gs = append(gs, float64(s.goroutines))
		}
	}
	if len(g.used) < 2 {
		return g
	}
	g.span = g.used[len(g.used)-1].at.Sub(g.used[0].at)
	g.rssSlope, _ = slope(xs, g.rss)
	g.heapSlope, _ = slope(xs, g.heap)
	g.goroutineSlope, _ = slope(xs, gs)
	return g
}

// judged reports whether the samples span long enough to hold the
// slopes to the limits.
func (g *growth) judged() bool { return len(g.used) >= 2 && g.span >= growthSpan }

// write writes the resident set size, live heap and goroutines of the
// process with their slopes, and the limits they are held to.
func (g *growth) write(w *tabwriter.Writer, lim growthLimits) {
	if g.lived == 0 {
		return
	}
	if len(g.used) < 2 {
		fmt.Fprintf(w, "proxier RSS\tn/a: the longest-lived proxier (%d) lived %v, %d samples after its first minute\n", g.id, g.lived, len(g.used))
		fmt.Fprintf(w, "growth limits\tnot judged: the samples span less than %v\n", growthSpan)
		return
	}
	first, last := g.used[0], g.used[len(g.used)-1]
	fmt.Fprintf(w, "proxier RSS\tfirst %.1f MiB, last %.1f MiB, slope %+.1f MiB/h (proxier %d, lived %v; %d samples after its first minute)\n",
		g.rss[0], g.rss[len(g.rss)-1], g.rssSlope, g.id, g.lived, len(g.used))
	fmt.Fprintf(w, "live heap\tfirst %.1f MiB, last %.1f MiB, slope %+.1f MiB/h\n", g.heap[0], g.heap[len(g.heap)-1], g.heapSlope)
	fmt.Fprintf(w, "goroutines\tfirst %d, last %d, slope %+.1f/h\n", first.goroutines, last.goroutines, g.goroutineSlope)
	if !g.judged() {
		fmt.Fprintf(w, "growth limits\tnot judged: the samples span %v, less than %v\n", g.span.Round(time.Second), growthSpan)
		return
	}
	fmt.Fprintf(w, "growth limits\tRSS %+.1f MiB/h of at most %.0f, goroutines %+.1f/h of at most %.0f: %s\n",
		g.rssSlope, lim.rssMiB, g.goroutineSlope, lim.goroutines, map[bool]string{true: "within", false: "EXCEEDED"}[len(g.exceeded(lim)) == 0])
}

// exceeded returns what fails the soak in the growth: a slope beyond its
// limit, over samples that span at least growthSpan.
func (g *growth) exceeded(lim growthLimits) []string {
	if !g.judged() {
		return nil
	}
	var out []string
	if g.rssSlope > lim.rssMiB {
		out = append(out, fmt.Sprintf("the proxier's RSS grew %+.1f MiB/h over %v, beyond the limit of %.0f MiB/h", g.rssSlope, g.span.Round(time.Second), lim.rssMiB))
	}
	if g.goroutineSlope > lim.goroutines {
		out = append(out, fmt.Sprintf("the proxier's goroutines grew %+.1f/h over %v, beyond the limit of %.0f/h", g.goroutineSlope, g.span.Round(time.Second), lim.goroutines))
	}
	return out
}

// describe formats a failure for the report.
func (l *ledger) describe(fl failure) string {
	ep := ""
	if fl.endpoint != "" {
		ep = " via " + fl.endpoint
	}
	return fmt.Sprintf("%s %s %s (%s)%s: %s", l.sinceLocked(fl.start), fl.what, serviceName(fl.svc), clusterIP(fl.svc), ep, fl.err)
}

// percent formats n/of as a percentage.
func percent(n, of int) string {
	if of == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// slope returns a robust slope of ys over xs: the median of the slopes
// between every two samples (the Theil-Sen estimator), over at most
// slopePoints samples spread evenly. Unlike a least-squares fit, it is
// not moved by a one-time step, such as a process's resident set growing
// to the peak of one large sync and staying there, while a steady growth
// gives every pair, and so the median, its rate. It reports false when
// the xs do not vary.
func slope(xs, ys []float64) (float64, bool) {
	if len(xs) < 2 || len(xs) != len(ys) {
		return 0, false
	}
	if n := len(xs); n > slopePoints {
		sx, sy := make([]float64, slopePoints), make([]float64, slopePoints)
		for i := range slopePoints {
			j := i * (n - 1) / (slopePoints - 1)
			sx[i], sy[i] = xs[j], ys[j]
		}
		xs, ys = sx, sy
	}
	var slopes []float64
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if dx := xs[j] - xs[i]; dx != 0 {
				slopes = append(slopes, (ys[j]-ys[i])/dx)
			}
		}
	}
	if len(slopes) == 0 {
		return 0, false
	}
	slices.Sort(slopes)
	m := len(slopes) / 2
	if len(slopes)%2 == 0 {
		return (slopes[m-1] + slopes[m]) / 2, true
	}
	return slopes[m], true
}

// slopePoints bounds the samples slope compares pairwise.
const slopePoints = 400
