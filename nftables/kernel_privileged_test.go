//go:build privileged || vm

package nftables_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestSyncMatchesRender writes a state through netlink in one namespace and
// loads its Render text with the real `nft -f` in another: both list the
// same table, with `nft list` and `nft -j list`.
func TestSyncMatchesRender(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	st := richState(t)
	a, b := netnstest.NewHost(t, "sync"), netnstest.NewHost(t, "nft")
	p := newProxier(t, a, nftables.Options{})
	mustSync(t, p, st)
	text, err := p.Render(st)
	if err != nil {
		t.Fatal(err)
	}
	b.ExecInput(t, text, "nft", "-f", "-")
	if diff := cmp.Diff(b.CanonicalTable(t, "inet", nftables.DefaultTable), a.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
		t.Errorf("table written through netlink differs from nft -f of Render (-nft +netlink):\n%s", diff)
	}
	listed := a.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable)
	for _, want := range []string{
		"ip daddr . meta l4proto . th dport @buckets4/cluster-2 meta l4proto @protocols4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints4",
		"dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 1 offset 4096 map @endpoints6",
		"ip6 daddr . meta l4proto . th dport vmap @services6",
		"10.96.0.12 . udp . 99",
		"fib saddr type local goto cluster4",
		"typeof ip saddr . numgen random mod 1 . numgen random mod 1",
	} {
		if !strings.Contains(listed, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, listed)
		}
	}
}

// TestUnchangedStateSendsNothing: a second Sync of the same state commits
// nothing, so the ruleset generation stays put.
func TestUnchangedStateSendsNothing(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "idle")
	p := newProxier(t, h, nftables.Options{})
	st := richState(t)
	mustSync(t, p, st)
	g := generation(t, h)
	mustSync(t, p, st)
	mustSync(t, p, st)
	if got := generation(t, h); got != g {
		t.Errorf("generation moved from %d to %d on syncs of an unchanged state", g, got)
	}
}

// TestForeignChangesRepaired: someone else flushes the table, deletes a
// chain's rule, adds a rule or deletes the table; the next Sync restores
// it. A commit elsewhere in the namespace leaves the table alone.
func TestForeignChangesRepaired(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "repair")
	// A deep check on every sync: every change below is repaired by the
	// next one.
	p := newProxier(t, h, nftables.Options{Logger: testLogger(t), VerifyInterval: time.Nanosecond})
	st := richState(t)
	mustSync(t, p, st)
	want := h.CanonicalTable(t, "inet", nftables.DefaultTable)
	ruleset := h.Exec(t, "nft", "list", "ruleset")
	for _, tc := range []struct {
		name string
		cmd  []string
	}{
		{"flush table", []string{"flush", "table", "inet", "kproxy"}},
		{"delete table", []string{"delete", "table", "inet", "kproxy"}},
		{"flush set", []string{"flush", "map", "inet", "kproxy", "services4"}},
		{"foreign rule", []string{"add", "rule", "inet", "kproxy", "services", "counter"}},
		{"flush chain", []string{"flush", "chain", "inet", "kproxy", "cluster4"}},
		{"foreign chain", []string{"add", "chain", "inet", "kproxy", "intruder"}},
		{"dormant table", []string{"add", "table", "inet", "kproxy", "{ flags dormant; }"}},
		{"base chain policy", []string{"add", "chain", "inet", "kproxy", "nat-output", "{ type nat hook output priority -100; policy drop; }"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.Exec(t, "nft", tc.cmd...)
			if h.Exec(t, "nft", "list", "ruleset") == ruleset {
				t.Fatal("the change did not change the table")
			}
			mustSync(t, p, st)
			if diff := cmp.Diff(want, h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
				t.Errorf("table not restored (-want +got):\n%s", diff)
			}
			if got := h.Exec(t, "nft", "list", "table", "inet", "kproxy"); strings.Contains(got, "dormant") {
				t.Errorf("table flags not restored:\n%s", got)
			}
		})
	}
	// A base chain made again by someone with another hook or priority,
	// and its rules: the counts a cheap check reads stay as they were, a
	// deep verify sees the hook.
	for _, tc := range []struct{ name, from, to string }{
		{"base chain priority", "priority -100", "priority 0"},
		{"base chain hook", "hook output", "hook prerouting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listed := h.Exec(t, "nft", "list", "chain", "inet", "kproxy", "nat-output")
			require.Contains(t, listed, tc.from)
			h.ExecInput(t, "flush chain inet kproxy nat-output\ndelete chain inet kproxy nat-output\n"+
				strings.Replace(listed, tc.from, tc.to, 1), "nft", "-f", "-")
			require.NotContains(t, h.Exec(t, "nft", "list", "chain", "inet", "kproxy", "nat-output"), tc.from)
			mustSync(t, p, st)
			if diff := cmp.Diff(want, h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
				t.Errorf("table not restored (-want +got):\n%s", diff)
			}
			assert.Contains(t, h.Exec(t, "nft", "list", "chain", "inet", "kproxy", "nat-output"), tc.from)
		})
	}
	t.Run("commit elsewhere", func(t *testing.T) {
		h.Exec(t, "nft", "add", "table", "ip", "someone-else")
		g := generation(t, h)
		mustSync(t, p, st)
		if got := generation(t, h); got != g {
			t.Errorf("a foreign commit outside the table made the proxier commit (generation %d -> %d)", g, got)
		}
	})
}

// TestCheapAndDeepChecks: a sync checks cheaply for what changes the
// table's object count or flags (the table deleted, a chain added, the
// table made dormant) and repairs it at once; what leaves them alone (a
// flushed chain or set) a deep check finds: that of a sync with changes
// once its interval has passed, that of a sync with nothing to change (the
// Runner's periodic one) at once.
func TestCheapAndDeepChecks(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "checks")
	p := newProxier(t, h, nftables.Options{Logger: testLogger(t), VerifyInterval: 2 * time.Second})
	st := richState(t)
	mustSync(t, p, st)
	want := h.CanonicalTable(t, "inet", nftables.DefaultTable)
	restored := func() bool { return h.CanonicalTable(t, "inet", nftables.DefaultTable) == want }
	for _, cmd := range [][]string{
		{"delete", "table", "inet", "kproxy"},
		{"add", "chain", "inet", "kproxy", "intruder"},
	} {
		h.Exec(t, "nft", cmd...)
		mustSync(t, p, st)
		if !restored() {
			t.Errorf("after %v: not repaired by the next sync", cmd)
		}
	}
	h.Exec(t, "nft", "add", "table", "inet", "kproxy", "{ flags dormant; }")
	mustSync(t, p, st)
	if strings.Contains(h.Exec(t, "nft", "list", "table", "inet", "kproxy"), "dormant") {
		t.Error("dormant table not repaired by the next sync")
	}
	mustSync(t, p, st) // a deep check (nothing to change) finds the table whole
	b := st.Edit()
	require.NoError(t, b.Upsert(servicelb.Service{Name: "default/more", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.60")},
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}}))
	more := b.State()
	web := func() string { return h.Exec(t, "nft", "list", "chain", "inet", "kproxy", "cluster4") }
	whole := web()
	h.Exec(t, "nft", "flush", "chain", "inet", "kproxy", "cluster4")
	flushed := web()
	require.NotEqual(t, whole, flushed)
	mustSync(t, p, more)
	mustSync(t, p, st)
	assert.Equal(t, flushed, web(), "a flushed chain was repaired by syncs with changes before the deep check was due: the cheap check read the rules")
	mustSync(t, p, st)
	assert.Equal(t, whole, web(), "a flushed chain not repaired by a sync with nothing to change")
	assert.Equal(t, want, h.CanonicalTable(t, "inet", nftables.DefaultTable))

	// A flush of the whole table empties the fixed chains too: the cheap
	// check of a sync with changes finds it.
	h.Exec(t, "nft", "flush", "table", "inet", "kproxy")
	mustSync(t, p, more)
	assert.Equal(t, whole, web(), "a flushed table was not repaired by the cheap check of a sync with changes")
}

// TestInvalidInputLeavesTable: a service the backend refuses is left out
// before anything is sent, whether it comes as a change or in a first
// sync, and the rest applied: here the state without it, the table as it
// was.
func TestInvalidInputLeavesTable(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "invalid")
	p := newProxier(t, h, nftables.Options{})
	st := richState(t)
	mustSync(t, p, st)
	before := h.Exec(t, "nft", "list", "ruleset")
	g := generation(t, h)

	ed := st.Edit()
	rr := servicelb.Service{Name: "default/rr", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.50")},
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}, Scheduler: servicelb.SchedulerRoundRobin}
	if err := ed.Upsert(rr); err != nil {
		t.Fatal(err)
	}
	many := servicelb.Service{Name: "default/many", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.51")},
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}}
	for i := range 4096 {
		many.Endpoints = append(many.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)})})
	}
	ed2 := st.Edit()
	if err := ed2.Upsert(many); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		st   *servicelb.State
		want error
	}{
		{"round robin", ed.State(), servicelb.ErrUnsupported},
		{"4096 endpoints", ed2.State(), servicelb.ErrCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if rep, err := p.Sync(testCtx(t), tc.st); err != nil || !errors.Is(servicetest.LeftOut(rep), tc.want) {
				t.Fatalf("Sync = %v, left out %v, want the service left out with %v", err, rep.LeftOut, tc.want)
			}
			if got := generation(t, h); got != g {
				t.Errorf("generation moved from %d to %d: the refused service reached the kernel", g, got)
			}
			fresh := newProxier(t, h, nftables.Options{})
			if rep, err := fresh.Sync(testCtx(t), tc.st); err != nil || !errors.Is(servicetest.LeftOut(rep), tc.want) {
				t.Fatalf("first Sync = %v, left out %v, want the service left out with %v", err, rep.LeftOut, tc.want)
			}
			if after := h.Exec(t, "nft", "list", "ruleset"); after != before {
				t.Errorf("ruleset changed:\n--- before\n%s\n--- after\n%s", before, after)
			}
			g = generation(t, h) // the new proxier adopted the table
		})
	}
	// The proxier still works afterwards.
	mustSync(t, p, st)
}

// TestCleanupDeletesOnlyTheTable: Cleanup removes the proxier's table and
// leaves a foreign table and another proxier's table alone; a second
// Cleanup is a no-op and a later Sync writes the table again.
func TestCleanupDeletesOnlyTheTable(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "cleanup")
	h.Exec(t, "nft", "add", "table", "ip", "foreign")
	h.Exec(t, "nft", "add", "chain", "ip", "foreign", "c", "{ type filter hook input priority 0 ; }")
	p := newProxier(t, h, nftables.Options{})
	other := newProxier(t, h, nftables.Options{Table: "other"})
	st := richState(t)
	mustSync(t, p, st)
	mustSync(t, other, st)
	if err := p.Cleanup(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	tables := h.Exec(t, "nft", "list", "tables")
	if strings.Contains(tables, "inet kproxy") || !strings.Contains(tables, "ip foreign") || !strings.Contains(tables, "inet other") {
		t.Errorf("tables after Cleanup:\n%s", tables)
	}
	if err := p.Cleanup(testCtx(t)); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
	mustSync(t, p, st)
	if diff := cmp.Diff(h.CanonicalTable(t, "inet", "other"), strings.ReplaceAll(h.CanonicalTable(t, "inet", "kproxy"), `"kproxy"`, `"other"`)); diff != "" {
		t.Errorf("tables of the two proxiers differ:\n%s", diff)
	}
}

// TestNewRejectsBadTableName: names nft could not parse back are refused.
func TestNewRejectsBadTableName(t *testing.T) {
	for _, name := range []string{"1abc", "a b", "a;b", strings.Repeat("x", 300)} {
		if _, err := nftables.New(nftables.Options{Table: name, NoConntrackCleanup: true}); !errors.Is(err, nftables.ErrInvalidOptions) {
			t.Errorf("New(Table: %q) error = %v, want ErrInvalidOptions", name, err)
		}
	}
}

// TestGoldenFilesLoad: every golden rendering loads with the real
// `nft -f`, into the same table Sync writes for its state.
func TestGoldenFilesLoad(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	for name, mk := range nftables.GoldenCases() {
		t.Run(name, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("testdata", name+".nft"))
			if err != nil {
				t.Fatal(err)
			}
			a, b := netnstest.NewHost(t, "sync"), netnstest.NewHost(t, "nft")
			mustSync(t, newProxier(t, a, nftables.Options{}), mk(t))
			b.ExecInput(t, string(text), "nft", "-f", "-")
			if diff := cmp.Diff(b.CanonicalTable(t, "inet", nftables.DefaultTable), a.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
				t.Errorf("(-nft -f +Sync):\n%s", diff)
			}
		})
	}
}

// TestAdoptsRenamedSet: a table written before the set of pods' sources
// was named pod-cidrs4/6 (cluster-cidrs4/6, read by an entry chain's
// rule) is adopted: the old set and its rule go, and the table is what a
// fresh one would be.
func TestAdoptsRenamedSet(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	fresh, h := netnstest.NewHost(t, "fresh"), netnstest.NewHost(t, "older")
	st := richState(t)
	mustSync(t, newProxier(t, fresh, nftables.Options{}), st)
	h.ExecInput(t, `table inet kproxy {
	set cluster-cidrs4 {
		type ipv4_addr
		flags interval
		elements = { 10.244.0.0/16 }
	}
	chain svc4-default/web/http {
		ip saddr != @cluster-cidrs4 counter
	}
}`, "nft", "-f", "-")
	mustSync(t, newProxier(t, h, nftables.Options{}), st)
	if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
		t.Errorf("adopted table differs from a fresh one (-fresh +adopted):\n%s", diff)
	}
}

// TestEndpointChangeCommitsLittle replaces the first, a middle and the
// last of a port's weighted endpoints in turn, then one by an address that
// sorts at the other end, changes a weight and adds an endpoint: after
// each sync the table equals a fresh one's, and each change commits a
// batch of the few buckets that moved (bucketOwners), not the port's
// every bucket.
func TestEndpointChangeCommitsLittle(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h, fresh := netnstest.NewHost(t, "inplace"), netnstest.NewHost(t, "fresh")
	eps := make([]servicelb.Endpoint, 40)
	for i := range eps {
		eps[i] = servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + 5*i)}), Weight: servicelb.Weight(uint16(1 + i%3))}
	}
	svc := func(eps []servicelb.Endpoint) servicelb.Service {
		return servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{clusterIP4},
			Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: eps}
	}
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, svc(eps)))
	replace := func(i int, addr string) func(e []servicelb.Endpoint) []servicelb.Endpoint {
		return func(e []servicelb.Endpoint) []servicelb.Endpoint {
			e[i].Addr = netip.MustParseAddr(addr)
			return e
		}
	}
	// The port's buckets are 80 elements (85 after the weight) of about
	// 50 bytes each: a batch that deleted and added them all would take
	// some 8,000 bytes. A replacement moves about log2 80 of them; a
	// weight changed from 3 to 7 adds 4 buckets, each of which moves a
	// few; an endpoint added or a weight changed also moves the frontend
	// to the bucket set of its new number of buckets, whose rule the
	// balancing chain gains in place of the old one.
	steps := []struct {
		name  string
		edit  func(eps []servicelb.Endpoint) []servicelb.Endpoint
		limit int
	}{
		{"first replaced", replace(0, "10.244.1.9"), 2000},
		{"middle replaced", replace(17, "10.244.1.96"), 2000},
		{"last replaced", replace(39, "10.244.2.3"), 2000},
		{"first replaced by one sorting last", replace(0, "10.244.3.1"), 2000},
		{"weight changed", func(e []servicelb.Endpoint) []servicelb.Endpoint { e[5].Weight = servicelb.Weight(7); return e }, 4000},
		{"endpoint added", func(e []servicelb.Endpoint) []servicelb.Endpoint {
			return append(e, servicelb.Endpoint{Addr: netip.MustParseAddr("10.244.2.4")})
		}, 3000},
	}
	for _, s := range steps {
		eps = s.edit(slices.Clone(eps))
		st := mustState(t, servicelb.NodeConfig{}, svc(eps))
		var sent int
		ctx := nfnl.WithTap(testCtx(t), func(f []byte) { sent += len(f) })
		require.NoError(t, servicetest.SyncErr(p.Sync(ctx, st)), s.name)
		q := newProxier(t, fresh, nftables.Options{NoConntrackCleanup: true})
		mustSync(t, q, st)
		if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
			t.Fatalf("%s: table differs from a fresh apply (-fresh +incremental):\n%s", s.name, diff)
		}
		require.NoError(t, q.Cleanup(testCtx(t)))
		t.Logf("%s: %d bytes committed", s.name, sent)
		assert.Less(t, sent, s.limit, "%s: bytes committed", s.name)
	}
}

// TestChangeIsOneRoundTrip: after the Proxier's own commit, a sync of a
// change sends its batch and reads nothing before it: the batch requires
// the generation to be still the Proxier's. After someone else's commit
// the kernel refuses that batch, and the same sync checks the table and
// applies the change; a table changed meanwhile is repaired.
func TestChangeIsOneRoundTrip(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "roundtrip")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	svc := func(ep string) servicelb.Service {
		return servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{clusterIP4},
			Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr(ep)}}}
	}
	b, err := servicelb.NewBuilder(servicelb.NodeConfig{})
	require.NoError(t, err)
	change := func(ep string) (*servicelb.State, []string) {
		t.Helper()
		require.NoError(t, b.Upsert(svc(ep)))
		st := b.State()
		var seen []string
		ctx := nfnl.WithRequests(testCtx(t), func(r nfnl.Request) { seen = append(seen, r.String()) })
		require.NoError(t, servicetest.SyncErr(p.Sync(ctx, st)))
		return st, seen
	}
	change("10.244.1.1")
	change("10.244.1.2") // the first sync's commit may be followed by none of its own
	_, seen := change("10.244.1.3")
	assert.Equal(t, []string{"commit"}, seen, "a change after the Proxier's own commit")

	h.Exec(t, "nft", "add", "table", "inet", "other")
	st, seen := change("10.244.1.4")
	assert.Equal(t, "commit", seen[0], "the change is sent first")
	assert.Equal(t, "commit", seen[len(seen)-1], "and again after the check: %v", seen)
	assert.Contains(t, seen, "generation")
	want, err := p.Render(st)
	require.NoError(t, err)
	fresh := netnstest.NewHost(t, "roundtripfresh")
	fresh.ExecInput(t, want, "nft", "-f", "-")
	assert.Equal(t, fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable))

	h.Exec(t, "nft", "add", "chain", "inet", nftables.DefaultTable, "intruder")
	st, _ = change("10.244.1.5")
	assert.NotContains(t, h.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable), "intruder", "repaired")
	want, err = p.Render(st)
	require.NoError(t, err)
	fresh.Exec(t, "nft", "delete", "table", "inet", nftables.DefaultTable)
	fresh.ExecInput(t, want, "nft", "-f", "-")
	assert.Equal(t, fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable))
}
