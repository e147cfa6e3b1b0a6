package soak

import (
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
	assert.InDelta(t, 0.2, s, 1e-9)
	_, ok = slope([]float64{1, 1}, []float64{1, 2})
	assert.False(t, ok, "xs that do not vary")
	_, ok = slope([]float64{1}, []float64{1})
	assert.False(t, ok, "one sample")
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
	assert.Equal(t, 1, tl.excused[whatSession])
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
