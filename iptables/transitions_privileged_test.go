//go:build privileged

package iptables

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestRandomTransitions applies 300 random state transitions (services
// added, changed and removed, now and then a node change) one sync each,
// then checks that the kernel's tables equal a fresh apply of the final
// state in another namespace, and Render's text.
func TestRandomTransitions(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	seed := rand.Uint64()
	if s, err := strconv.ParseUint(os.Getenv("KPROXY_TEST_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("seed %d", seed)
	g := servicetest.New(randomOptions(servicetest.Options{Seed: seed}))
	h := netnstest.NewHost(t, "iptrand")
	px := newProxier(t, h, Options{})
	cc := &countingConn{Conn: px.conn}
	px.conn, px.ap = cc, newApplier(px, cc)

	b, err := servicelb.NewBuilder(g.Node())
	if err != nil {
		t.Fatal(err)
	}
	// Services the Proxier refuses are refused at the source, as a
	// Runner does.
	if err := b.Require(px.Capabilities()); err != nil {
		t.Fatal(err)
	}
	for step := range 300 {
		if kind, err := g.Step(b); err != nil && !errors.Is(err, servicelb.ErrUnsupported) {
			t.Fatalf("step %d (%s): %v", step, kind, err)
		}
		before := cc.batches
		if err := servicetest.SyncErr(px.Sync(ctx, b.State())); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if n := cc.batches - before; n > 1 {
			t.Fatalf("step %d: sync sent %d batches", step, n)
		}
		if step%50 == 49 {
			checkRendered(t, h, px, b.State(), fmt.Sprintf("step %d", step))
		}
	}
	final := b.State()
	checkRendered(t, h, px, final, "final state")
	fresh := netnstest.NewHost(t, "iptfresh")
	if err := servicetest.SyncErr(newProxier(t, fresh, Options{}).Sync(ctx, final)); err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if diff := cmp.Diff(saved(t, fresh, f), saved(t, h, f)); diff != "" {
			t.Errorf("%s after 300 transitions differs from a fresh apply (-fresh +transitions):\n%s", saveCmd(f), diff)
		}
	}
	if t.Failed() {
		t.Logf("reproduce with seed %d", seed)
	}
}

// dumpAll returns everything nf_tables holds, as nft lists it with
// expressions, for before/after comparisons.
func dumpAll(t *testing.T, h *netnstest.Host) string {
	t.Helper()
	return h.Exec(t, "nft", "--debug=netlink", "list", "ruleset")
}

// TestFailedSyncChangesNothing checks that syncs that fail leave the
// kernel's tables exactly as they were: a state the Proxier refuses before
// sending anything, and a batch the kernel refuses halfway (a foreign rule
// still uses a chain the sync deletes), which must not apply its first
// half.
func TestFailedSyncChangesNothing(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptfail")
	px := newProxier(t, h, Options{})
	st := richState(t)
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		t.Fatal(err)
	}
	before := dumpAll(t, h)

	// The node's masquerade mark is the drop mark.
	bad := richNode()
	bad.MasqueradeBit = DefaultDropBit
	badState, err := servicelb.NewState(bad, richServices()...)
	if err != nil {
		t.Fatal(err)
	}
	if err := servicetest.SyncErr(px.Sync(ctx, badState)); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("sync with the masquerade bit on the drop bit: %v, want ErrInvalidOptions", err)
	}
	if err := servicetest.SyncErr(px.Sync(ctx, nil)); err == nil {
		t.Fatal("sync of a nil state succeeded")
	}
	if after := dumpAll(t, h); after != before {
		t.Fatalf("refused syncs changed the tables:\n%s", cmp.Diff(before, after))
	}

	// A foreign rule jumps to the SVC chain of default/web, which the next
	// state removes together with other changes. The foreign chain exists
	// from before, so the cheap check passes and the sync goes the
	// incremental way; the kernel refuses the chain's deletion.
	svc := px.n.svc(st.Port(servicelb.ServicePortKey{Service: "default/web", Port: "http", Family: servicelb.IPv4}))
	h.Exec(t, "iptables-nft", "-t", "nat", "-N", "FOREIGN")
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		t.Fatal(err)
	}
	h.Exec(t, "iptables-nft", "-t", "nat", "-A", "FOREIGN", "-j", svc)
	before = dumpAll(t, h)
	edit := st.Edit()
	edit.Delete("default/web")
	svcs := richServices()
	svcs[1].Endpoints = svcs[1].Endpoints[:1]
	if err := edit.Upsert(svcs[1]); err != nil {
		t.Fatal(err)
	}
	next := edit.State()
	err = servicetest.SyncErr(px.Sync(ctx, next))
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("sync deleting a chain in use: %v, want EBUSY", err)
	}
	if after := dumpAll(t, h); after != before {
		t.Fatalf("a refused batch changed the tables:\n%s", cmp.Diff(before, after))
	}
	// The next sync reads the tables back: it applies the state but only
	// flushes the chain the foreign rule uses.
	if err := servicetest.SyncErr(px.Sync(ctx, next)); err != nil {
		t.Fatal(err)
	}
	if got := h.Exec(t, "iptables-nft", "-t", "nat", "-S", svc); got != "-N "+svc+"\n" {
		t.Errorf("chain in use after the sync: %q, want it empty", got)
	}
	// Once the foreign chain is gone, the next sync deletes it.
	h.Exec(t, "iptables-nft", "-t", "nat", "-F", "FOREIGN")
	h.Exec(t, "iptables-nft", "-t", "nat", "-X", "FOREIGN")
	if err := servicetest.SyncErr(px.Sync(ctx, next)); err != nil {
		t.Fatal(err)
	}
	checkRendered(t, h, px, next, "after the retry")
}

// TestSchedulerHintRefused: a scheduler hint the Proxier does not honour
// fails Render with servicelb's ErrUnsupported, naming the service and the
// field; Sync leaves that service out with the same error
// (SyncReport.LeftOut) and applies the rest.
func TestSchedulerHintRefused(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "ipthint")
	px := newProxier(t, h, Options{})
	state := func(hint servicelb.Scheduler) *servicelb.State {
		svcs := richServices()
		svcs[0].Scheduler = hint
		st, err := servicelb.NewState(richNode(), svcs...)
		require.NoError(t, err)
		return st
	}
	refused := func(err error) {
		t.Helper()
		require.ErrorIs(t, err, servicelb.ErrUnsupported)
		var ve *servicelb.ValidationError
		require.ErrorAs(t, err, &ve)
		assert.Equal(t, "default/web", ve.Service)
		assert.Equal(t, "scheduler", ve.Field)
	}
	without := func(hint servicelb.Scheduler) *servicelb.State {
		b := state(hint).Edit()
		b.Delete("default/web")
		return b.State()
	}
	// The refused service is left out; the rest is applied.
	rep, err := px.Sync(ctx, state(servicelb.SchedulerRoundRobin))
	require.NoError(t, err)
	refused(servicetest.LeftOut(rep))
	checkRendered(t, h, px, without(""), "after a first sync that left a service out")
	_, err = px.Render(state(servicelb.SchedulerMaglev))
	refused(err)

	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, state(servicelb.SchedulerRandom))))
	checkRendered(t, h, px, state(""), "after the service was fixed")
	refused(servicetest.SyncErr(px.Sync(ctx, state(servicelb.SchedulerLeastConn))))
	checkRendered(t, h, px, without(""), "after the service was broken again")
}

// TestRepairsForeignDamage deletes the Proxier's jumps and chains behind
// its back, as an operator's iptables commands would, and checks that the
// next sync of the same state restores them.
func TestRepairsForeignDamage(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	st := richState(t)
	for _, tc := range []struct {
		name   string
		damage [][]string
	}{
		{"jump deleted", [][]string{{"iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KPROXY-SERVICES"}}},
		{"filter jump deleted", [][]string{{"ip6tables-nft", "-t", "filter", "-D", "FORWARD", "-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KPROXY-FORWARD"}}},
		{"table flushed and chains deleted", [][]string{{"iptables-nft", "-t", "nat", "-F"}, {"iptables-nft", "-t", "nat", "-X"}}},
		{"whole ruleset flushed", [][]string{{"nft", "flush", "ruleset"}}},
		// Changes inside chains, which no cheap check sees: the deep
		// check of a sync with nothing to change finds them.
		{"rule deleted in a shared chain", [][]string{{"iptables-nft", "-t", "nat", "-D", "KPROXY-SERVICES", "1"}}},
		{"rule replaced in a shared chain", [][]string{{"iptables-nft", "-t", "filter", "-R", "KPROXY-SERVICES", "1", "-j", "RETURN"}}},
		{"rule added to a shared chain", [][]string{{"iptables-nft", "-t", "nat", "-I", "KPROXY-NODEPORTS", "-j", "ACCEPT"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := netnstest.NewHost(t, "iptrepair")
			px := newProxier(t, h, Options{})
			if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
				t.Fatal(err)
			}
			for _, cmd := range tc.damage {
				h.Exec(t, cmd[0], cmd[1:]...)
			}
			if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
				t.Fatal(err)
			}
			checkRendered(t, h, px, st, "after repair")
		})
	}
}

// TestDeleteOfARuleAlreadyGone: someone deletes the rules of a service in
// the shared chains; the sync that removes the service does not fail for
// the rules it can no longer find, and leaves the tables exactly as
// rendered.
func TestDeleteOfARuleAlreadyGone(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptgone")
	px := newProxier(t, h, Options{})
	st := richState(t)
	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, st)))
	for _, line := range strings.Split(h.Exec(t, "iptables-nft", "-t", "nat", "-S", "KPROXY-SERVICES"), "\n") {
		if strings.Contains(line, "default/web:http") {
			h.Exec(t, "sh", "-c", "iptables-nft -t nat "+strings.Replace(line, "-A", "-D", 1))
		}
	}
	b := st.Edit()
	b.Delete("default/web")
	next := b.State()
	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, next)))
	checkRendered(t, h, px, next, "after the service whose rules were gone was removed")
}

// TestChangesTouchOnlyTheirChains checks that a sync sends only what a
// change needs: an endpoint change rewrites its port's SVC chain and
// deletes the SEP chain of the endpoint that left, without touching the
// shared chains; a new or removed service edits the shared chains rule by
// rule; each sync is one batch.
func TestChangesTouchOnlyTheirChains(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptchange")
	px := newProxier(t, h, Options{})
	cc := &countingConn{Conn: px.conn}
	px.conn, px.ap = cc, newApplier(px, cc)
	st := richState(t)
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		t.Fatal(err)
	}
	webKey := servicelb.ServicePortKey{Service: "default/web", Port: "http", Family: servicelb.IPv4}
	web := st.Port(webKey)
	gone := web.Cluster[1]
	svcs := richServices()
	svcs[0].Endpoints = slices.DeleteFunc(svcs[0].Endpoints, func(e servicelb.Endpoint) bool { return e.Addr == gone.Addr })
	extra := servicelb.Service{Name: "new/svc", ClusterIPs: addrs("10.96.9.9"),
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
		Endpoints: []servicelb.Endpoint{ep("10.244.1.9", "node-a")}}
	newKey := servicelb.ServicePortKey{Service: "new/svc", Family: servicelb.IPv4}
	steps := []struct {
		name string
		edit func(b *servicelb.Builder)
		// chains each message may name, and how many messages
		allowed func(st *servicelb.State) []string
		msgs    int
	}{
		{"endpoint removed", func(b *servicelb.Builder) { must(t, b.Upsert(svcs[0])) },
			func(*servicelb.State) []string { return []string{px.n.svc(web), px.n.sep(web, gone)} },
			// flush and refill the SVC chain (masquerade rule and one
			// endpoint), flush and delete the SEP chain.
			1 + 2 + 2},
		{"service added", func(b *servicelb.Builder) { must(t, b.Upsert(extra)) },
			func(st *servicelb.State) []string {
				sp := st.Port(newKey)
				return []string{px.n.svc(sp), px.n.sep(sp, sp.Cluster[0]), "KPROXY-SERVICES"}
			},
			// two chains created and filled (2 rules each), one rule
			// inserted in nat KPROXY-SERVICES and one in filter
			// KPROXY-SERVICES (the cluster IP's other ports).
			2 + 4 + 1 + 1},
		{"service removed", func(b *servicelb.Builder) { b.Delete("new/svc") },
			func(*servicelb.State) []string {
				sp := st.Port(newKey)
				return []string{px.n.svc(sp), px.n.sep(sp, sp.Cluster[0]), "KPROXY-SERVICES"}
			},
			// a rule deleted by handle in each KPROXY-SERVICES, two
			// chains flushed and deleted.
			2 + 2 + 2},
	}
	b := st.Edit()
	for _, s := range steps {
		s.edit(b)
		next := b.State()
		if s.name == "service added" {
			st = next
		}
		before := cc.batches
		if err := servicetest.SyncErr(px.Sync(ctx, next)); err != nil {
			t.Fatal(err)
		}
		if cc.batches != before+1 {
			t.Fatalf("%s: %d batches", s.name, cc.batches-before)
		}
		allowed := s.allowed(next)
		ops := strings.Split(strings.TrimSpace(cc.last), "\n")
		for _, op := range ops {
			f := strings.Fields(op)
			if len(f) < 5 || !slices.Contains(allowed, f[4]) {
				t.Errorf("%s: message %q outside %v", s.name, op, allowed)
			}
		}
		if len(ops) != s.msgs {
			t.Errorf("%s: %d messages, want %d:\n%s", s.name, len(ops), s.msgs, cc.last)
		}
		checkRendered(t, h, px, next, s.name)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRestartAdopts: a new Proxier (a restarted agent) finds what the
// previous one wrote: syncing the same state sends nothing, and syncing a
// changed state sends only the difference, leaving the rest (and the
// rule handles of the shared chains) in place.
func TestRestartAdopts(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptrestart")
	st := richState(t)
	if err := servicetest.SyncErr(newProxier(t, h, Options{}).Sync(ctx, st)); err != nil {
		t.Fatal(err)
	}
	handles := h.Exec(t, "nft", "-a", "list", "chain", "ip", "nat", "KPROXY-SERVICES")

	px := newProxier(t, h, Options{})
	cc := &countingConn{Conn: px.conn}
	px.conn, px.ap = cc, newApplier(px, cc)
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		t.Fatal(err)
	}
	if cc.batches != 0 {
		t.Fatalf("restarted sync of the same state sent %d batches:\n%s", cc.batches, cc.last)
	}
	if got := h.Exec(t, "nft", "-a", "list", "chain", "ip", "nat", "KPROXY-SERVICES"); got != handles {
		t.Errorf("rules of KPROXY-SERVICES changed:\n%s\nwant\n%s", got, handles)
	}

	svcs := richServices()
	svcs[1].Endpoints = svcs[1].Endpoints[:1]
	next, err := servicelb.NewState(richNode(), svcs...)
	if err != nil {
		t.Fatal(err)
	}
	px2 := newProxier(t, h, Options{})
	cc2 := &countingConn{Conn: px2.conn}
	px2.conn, px2.ap = cc2, newApplier(px2, cc2)
	if err := servicetest.SyncErr(px2.Sync(ctx, next)); err != nil {
		t.Fatal(err)
	}
	for _, op := range strings.Split(strings.TrimSpace(cc2.last), "\n") {
		if !strings.Contains(op, "KPROXY-SVC-") && !strings.Contains(op, "KPROXY-SEP-") {
			t.Errorf("restarted sync of a changed state: message %q beyond the changed service's chains", op)
		}
	}
	checkRendered(t, h, px2, next, "after the restarted sync")
}

// TestFullResync: damage the cheap check cannot see (one of the Proxier's
// chains flushed, a rule of a shared chain deleted) is repaired by the
// next deep check: that of a sync with nothing to change, or that of a
// sync with changes once VerifyInterval has passed.
func TestFullResync(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptfull")
	st := richState(t)
	b := st.Edit()
	require.NoError(t, b.Upsert(servicelb.Service{Name: "default/more", ClusterIPs: addrs("10.96.0.60"),
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}}))
	more := b.State()
	px := newProxier(t, h, Options{VerifyInterval: time.Nanosecond})
	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, st)))
	svc := px.n.svc(st.Port(servicelb.ServicePortKey{Service: "default/web", Port: "http", Family: servicelb.IPv4}))
	h.Exec(t, "iptables-nft", "-t", "nat", "-F", svc)
	h.Exec(t, "iptables-nft", "-t", "nat", "-D", "KPROXY-SERVICES", "1")
	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, more)))
	checkRendered(t, h, px, more, "after a change once the interval passed")

	// With the default interval a sync with changes checks cheaply only:
	// the damage stays until a sync with nothing to change.
	lazy := newProxier(t, h, Options{})
	require.NoError(t, servicetest.SyncErr(lazy.Sync(ctx, st)))
	h.Exec(t, "iptables-nft", "-t", "nat", "-F", svc)
	require.NoError(t, servicetest.SyncErr(lazy.Sync(ctx, more)))
	assert.Equal(t, "-N "+svc+"\n", h.Exec(t, "iptables-nft", "-t", "nat", "-S", svc),
		"a sync with changes read the rules back before the interval passed")
	require.NoError(t, servicetest.SyncErr(lazy.Sync(ctx, more)))
	checkRendered(t, h, lazy, more, "after a sync with nothing to change")
}
