package soak

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The soak's own logic, without root.

func TestSlope(t *testing.T) {
	s, ok := slope([]float64{0, 1, 2, 3}, []float64{10, 12, 14, 16})
	require.True(t, ok)
	assert.InDelta(t, 2, s, 1e-9)
	s, ok = slope([]float64{0, 1, 2, 3}, []float64{5, 4, 6, 5})
	require.True(t, ok)
	assert.InDelta(t, 0.25, s, 1e-9, "the median of the pairwise slopes -1, 0.5, 0, 2, 0.5, -1")
	_, ok = slope([]float64{1, 1}, []float64{1, 2})
	assert.False(t, ok, "xs that do not vary")
	_, ok = slope([]float64{1}, []float64{1})
	assert.False(t, ok, "one sample")

	// A one-time step (a resident set that grows to the peak of a large
	// sync a minute in and stays there) is no growth; a steady growth
	// under noise is, at its rate, over more samples than are compared.
	var xs, step, steady []float64
	for i := range 1000 {
		x := float64(i) / 1000
		xs = append(xs, x)
		step = append(step, 40+40*float64(min(1, i/150)))
		steady = append(steady, 40+30*x+float64(i%7)-3)
	}
	s, ok = slope(xs, step)
	require.True(t, ok)
	assert.InDelta(t, 0, s, 1e-9)
	s, ok = slope(xs, steady)
	require.True(t, ok)
	assert.InDelta(t, 30, s, 1)
}

// TestSortFailures: a failure whose span meets a window is the fault's,
// also one that began before the fault or ended after the window, and
// the latest fault's where windows overlap; a session failure outside
// windows whose endpoint had just left is excused; the rest are real.
func TestSortFailures(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	l := newLedger()
	l.begin(t0)
	flush := l.opened(faultFlush, at(10), "flush")
	l.repaired(flush, at(12))
	l.synced(1, at(13), event{Kind: evSync})
	l.note(faultRestart, at(30), "killed")
	element := l.opened(faultDeleteElement, at(45), "element")
	open := l.opened(faultDormant, at(50), "dormant")
	require.Equal(t, at(15), flush.closed, "the window closes 2 s after the first successful sync after the repair")
	require.True(t, open.closed.IsZero())

	for _, fl := range []failure{
		{what: whatAsk, start: at(9), end: at(11)},                         // began before the fault
		{what: whatAsk, start: at(14.5), end: at(16.5)},                    // ended after the window
		{what: whatSession, start: at(60), end: at(62), endpoint: "x"},     // in both open windows: the latest fault's
		{what: whatAsk, start: at(46), end: at(48)},                        // in the element's window
		{what: whatAsk, start: at(20), end: at(22)},                        // real
		{what: whatSession, start: at(31), end: at(33), removed: true},     // excused
		{what: whatSession, start: at(40), end: at(42), endpoint: "y"},     // real
		{what: whatConnect, start: at(30.5), end: at(32.5), removed: true}, // real: a restart has no window
	} {
		l.failed(fl)
	}
	tl := l.sortFailures()
	assert.Len(t, tl.byFault[flush], 2)
	assert.Len(t, tl.byFault[open], 1)
	assert.Len(t, tl.byFault[element], 1)
	require.Len(t, tl.removed, 1)
	assert.Equal(t, at(31), tl.removed[0].start)
	require.Len(t, tl.real, 3)
	assert.Equal(t, at(20), tl.real[0].start)
	assert.Equal(t, at(40), tl.real[1].start)
	assert.Equal(t, whatConnect, tl.real[2].what)
}

// TestSyncCounts: a success after failures of the same process is not
// at the first attempt; another process's failures do not count.
func TestSyncCounts(t *testing.T) {
	l := newLedger()
	now := time.Now()
	for _, s := range []struct {
		id  int
		err string
	}{{1, ""}, {1, "boom"}, {2, ""}, {1, "boom"}, {1, ""}, {1, ""}} {
		l.synced(s.id, now, event{Kind: evSync, Err: s.err})
	}
	assert.Equal(t, 6, l.attempts)
	assert.Equal(t, 4, l.ok)
	assert.Equal(t, 3, l.firstOK)
	assert.Equal(t, map[string]int{"boom": 2}, l.syncErrors)
}

func TestCanonicalSave(t *testing.T) {
	a := `*nat
:PREROUTING ACCEPT [0:0]
:KPROXY-SVC-B - [0:0]
:KPROXY-SVC-A - [0:0]
-A PREROUTING -j KPROXY-SERVICES
-A KPROXY-SVC-B -j x
-A KPROXY-SVC-A -j y
-A KPROXY-SVC-B -j z
COMMIT
`
	b := `*nat
:KPROXY-SVC-A - [0:0]
:PREROUTING ACCEPT [0:0]
:KPROXY-SVC-B - [0:0]
-A KPROXY-SVC-A -j y
-A KPROXY-SVC-B -j x
-A PREROUTING -j KPROXY-SERVICES
-A KPROXY-SVC-B -j z
COMMIT
`
	assert.Equal(t, canonicalSave(a), canonicalSave(b))
	swapped := `*nat
:PREROUTING ACCEPT [0:0]
:KPROXY-SVC-B - [0:0]
:KPROXY-SVC-A - [0:0]
-A PREROUTING -j KPROXY-SERVICES
-A KPROXY-SVC-B -j z
-A KPROXY-SVC-A -j y
-A KPROXY-SVC-B -j x
COMMIT
`
	assert.NotEqual(t, canonicalSave(a), canonicalSave(swapped), "the order of a chain's rules counts")
}

func TestNftKey(t *testing.T) {
	listing := `{"nftables": [{"metainfo": {}},
{"map": {"name": "services4", "elem": [[{"concat": ["172.16.0.1", "tcp", 80]}, {"goto": {"target": "svc4-a/http"}}]]}},
{"set": {"name": "cluster-cidrs4", "elem": [{"prefix": {"addr": "10.244.0.0", "len": 16}}]}},
{"map": {"name": "backends4-27", "elem": [[{"range": [1782689792, 1782691156]}, {"concat": ["10.244.1.2", 8081]}]]}},
{"set": {"name": "cluster-ips4", "elem": ["172.16.0.1"]}},
{"set": {"name": "affinity4"}},
{"chain": {"name": "services"}}]}`
	sets, err := listedElements(listing)
	require.NoError(t, err)
	var got []string
	for _, s := range sets {
		for _, e := range s.elems {
			k, err := nftKey(e)
			require.NoError(t, err)
			got = append(got, s.name+" "+k)
		}
	}
	assert.Equal(t, []string{
		"services4 172.16.0.1 . tcp . 80",
		"cluster-cidrs4 10.244.0.0/16",
		"backends4-27 1782689792-1782691156",
		"cluster-ips4 172.16.0.1",
	}, got)
}

func TestLineDiff(t *testing.T) {
	missing, extra := lineDiff("a\nb\nb\nc", "b\nc\nd\nc")
	assert.Equal(t, []string{"a", "b"}, missing)
	assert.Equal(t, []string{"c", "d"}, extra)
}

// TestWindowBounded: a fault seen repaired but followed by no successful
// sync keeps its window open no longer than an unrepaired fault's, so
// that it does not excuse the failures of the rest of the run.
func TestWindowBounded(t *testing.T) {
	t0 := time.Now()
	l := newLedger()
	l.begin(t0)
	f := l.opened(faultFlush, t0.Add(10*time.Second), "flush")
	l.repaired(f, t0.Add(12*time.Second))
	inside := failure{what: whatAsk, start: t0.Add(20 * time.Second), end: t0.Add(22 * time.Second)}
	later := failure{what: whatAsk, start: t0.Add(10 * time.Minute), end: t0.Add(10*time.Minute + 2*time.Second)}
	l.failed(inside)
	l.failed(later)
	tl := l.sortFailures()
	assert.Equal(t, []failure{inside}, tl.byFault[f])
	assert.Equal(t, []failure{later}, tl.real)
}

// lifeOf records a proxier process that lived d with a sample every 2 s
// whose resident set size and goroutines grow by the given amounts an
// hour.
func lifeOf(l *ledger, id int, born time.Time, d time.Duration, rssMiBPerHour, goroutinesPerHour float64) {
	l.born(id, born)
	for at := time.Duration(0); at <= d; at += 2 * time.Second {
		h := at.Hours()
		l.sample(id, sample{at: born.Add(at), rssKiB: int((40 + rssMiBPerHour*h) * 1024),
			goroutines: int(20 + goroutinesPerHour*h), heapLive: 20 << 20})
	}
	l.died(id, born.Add(d))
}

// TestGrowthLimits: the slopes of the longest-lived proxier's RSS and
// goroutines fail the soak beyond their limits, when its samples after
// the first minute span growthSpan or more; over less they are shown but
// not judged.
func TestGrowthLimits(t *testing.T) {
	lim := growthLimits{rssMiB: 64, goroutines: 60}
	t0 := time.Now().Add(-time.Hour)
	for _, tc := range []struct {
		name          string
		lived         time.Duration
		rss, routines float64
		want          []string
		text          string
	}{
		{"flat", 10 * time.Minute, 0, 0, nil, "within"},
		{"rss leak", 10 * time.Minute, 120, 0, []string{"the proxier's RSS grew +120.0 MiB/h over 9m0s, beyond the limit of 64 MiB/h"}, "EXCEEDED"},
		{"goroutine leak", 10 * time.Minute, 10, 600, []string{"the proxier's goroutines grew +600.0/h over 9m0s, beyond the limit of 60/h"}, "EXCEEDED"},
		{"too short to judge", 4 * time.Minute, 600, 6000, nil, "not judged: the samples span 3m0s, less than 5m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			l.begin(t0)
			lifeOf(l, 1, t0, tc.lived, tc.rss, tc.routines)
			lifeOf(l, 2, t0.Add(tc.lived), time.Minute, 6000, 6000) // shorter-lived: not measured
			l.synced(1, t0.Add(time.Second), event{Kind: evSync})
			rep := l.report(reportInput{backend: "nftables", duration: tc.lived, equal: true, limits: lim})
			var growthErrs []string
			for _, e := range rep.errors {
				if strings.Contains(e, "grew") {
					growthErrs = append(growthErrs, e)
				}
			}
			assert.Equal(t, tc.want, growthErrs)
			assert.Contains(t, rep.text, "growth limits")
			assert.Contains(t, rep.text, tc.text)
		})
	}
}

// TestReportExcused: the report lists the excused failures apart from the
// real ones, each with why it is excused; only the real ones fail the
// soak.
func TestReportExcused(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	l := newLedger()
	l.begin(t0)
	f := l.opened(faultDeleteChain, at(10), "chain")
	l.repaired(f, at(11))
	l.synced(1, at(12), event{Kind: evSync})
	l.failed(failure{what: whatAsk, start: at(10.5), end: at(12.5), svc: 3, err: "i/o timeout"})
	l.failed(failure{what: whatSession, start: at(30), end: at(32), svc: 4, endpoint: "backend-2", removed: true, err: "receive: EOF"})
	l.failed(failure{what: whatAsk, start: at(40), end: at(42), svc: 5, err: "connection refused"})
	rep := l.report(reportInput{backend: "nftables", duration: time.Minute, equal: true, kinds: []faultKind{faultDeleteChain}})
	assert.Contains(t, rep.text, "excused failures (2): 1 inside an injected fault's repair window, 1 of sessions whose endpoint left its service within 5s before")
	assert.Contains(t, rep.text, "+10.5s ask soak/svc-0003 (172.16.0.4): i/o timeout [fault delete-chain at +10s]")
	assert.Contains(t, rep.text, "endpoint removed just before:\n    +30s session soak/svc-0004 (172.16.0.5) via backend-2: receive: EOF")
	assert.Contains(t, rep.text, "real failures (1):\n  +40s ask soak/svc-0005 (172.16.0.6): connection refused")
	assert.Equal(t, []string{"1 failures outside every fault window (listed in the report)"}, rep.errors)
}
