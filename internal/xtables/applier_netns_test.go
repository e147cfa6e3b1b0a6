//go:build privileged || vm

package xtables

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var natT = Table{IPv4, NAT}

func testOwns(_ TableName, chain string) bool { return strings.HasPrefix(chain, "KT-") }

func newTestApplier(t *testing.T, h *netnstest.Host) *Applier {
	t.Helper()
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return NewApplier(ApplierOptions{Conn: c, Owns: testOwns})
}

func keyRule(key string, n int) Rule {
	return Rule{Dst: pfx(fmt.Sprintf("10.96.0.%d/32", n)), Proto: ProtoTCP,
		Matches: []Match{Comment(key), Port{ProtoTCP, 80}}, Target: Jump("KT-A")}
}

func content(keys ...int) *TableContent {
	c := &TableContent{
		Chains: map[string][]Rule{"KT-A": {{Target: OrMark(0x4000)}}},
		Keyed:  map[string]map[string][]Rule{"KT-K": {}},
		Jumps:  map[string][]Rule{"PREROUTING": {{Matches: []Match{Comment("kt portals")}, Target: Jump("KT-K")}}},
	}
	for _, k := range keys {
		key := fmt.Sprintf("key%02d", k)
		c.Keyed["KT-K"][key] = []Rule{keyRule(key, k), keyRule(key, k+100)}
	}
	c.Keyed["KT-K"]["\xff"] = []Rule{{Matches: []Match{Comment("tail")}, Target: Return}}
	return c
}

// saveOurs returns iptables-nft-save's nat table without comment lines.
func saveNAT(t *testing.T, h *netnstest.Host) string {
	return StripSave(h.Exec(t, "iptables-nft-save", "-t", "nat"))
}

func render(c *TableContent) string {
	return string(AppendSaveTable(nil, IPv4, c.Text(NAT)))
}

func TestApplierReconcileCommitCheck(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "xtapply")
	a := newTestApplier(t, h)

	if _, err := a.Commit(ctx, NewTx()); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Commit before Reconcile: %v, want ErrNotLoaded", err)
	}
	want := content(1, 3, 5)
	if _, err := a.Reconcile(ctx, map[Table]*TableContent{natT: want}); err != nil {
		t.Fatal(err)
	}
	if got := saveNAT(t, h); got != render(want) {
		t.Fatalf("after reconcile:\n%s\nwant\n%s", got, render(want))
	}
	// Reconciling again sends nothing.
	if st, err := a.Reconcile(ctx, map[Table]*TableContent{natT: want}); err != nil || st.Messages != 0 {
		t.Fatalf("second reconcile: %+v, %v; want no messages", st, err)
	}

	// Keys inserted before, between and after others, one changed, one
	// removed: each lands in key order, placed by handle or by batch id.
	tx := NewTx()
	for _, k := range []int{0, 2, 4, 6} {
		key := fmt.Sprintf("key%02d", k)
		tx.SetKeyed(natT, "KT-K", key, []Rule{keyRule(key, k)})
	}
	tx.SetKeyed(natT, "KT-K", "key03", []Rule{keyRule("key03", 33)})
	tx.SetKeyed(natT, "KT-K", "key05", nil)
	tx.SetKeyed(natT, "KT-K", "key01", []Rule{keyRule("key01", 1), keyRule("key01", 101)}) // unchanged
	st, err := a.Commit(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	// 2 deletions (key03) + 2 (key05) + 5 insertions.
	if st.Messages != 9 {
		t.Errorf("commit sent %d messages, want 9", st.Messages)
	}
	want = content(1)
	for _, k := range []int{0, 2, 4, 6} {
		key := fmt.Sprintf("key%02d", k)
		want.Keyed["KT-K"][key] = []Rule{keyRule(key, k)}
	}
	want.Keyed["KT-K"]["key03"] = []Rule{keyRule("key03", 33)}
	if got := saveNAT(t, h); got != render(want) {
		t.Fatalf("after commit:\n%s\nwant\n%s", got, render(want))
	}
	// The handles learned from the commit serve the next one.
	tx = NewTx()
	tx.SetKeyed(natT, "KT-K", "key02", nil)
	tx.SetKeyed(natT, "KT-K", "key04", []Rule{keyRule("key04", 44)})
	tx.SetChain(natT, "KT-A", []Rule{{Target: OrMark(0x8000)}})
	if _, err := a.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	delete(want.Keyed["KT-K"], "key02")
	want.Keyed["KT-K"]["key04"] = []Rule{keyRule("key04", 44)}
	want.Chains["KT-A"] = []Rule{{Target: OrMark(0x8000)}}
	if got := saveNAT(t, h); got != render(want) {
		t.Fatalf("after second commit:\n%s\nwant\n%s", got, render(want))
	}
	if ok, err := a.Check(ctx); !ok || err != nil {
		t.Fatalf("Check after own commits: %v, %v", ok, err)
	}

	// A foreign change elsewhere passes the cheap check; deleting our
	// jump does not, and reconciling restores it.
	h.Exec(t, "iptables-nft", "-t", "nat", "-N", "FOREIGN")
	h.Exec(t, "iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "FOREIGN")
	if ok, err := a.Check(ctx); ok || err != nil {
		t.Fatalf("Check after a foreign chain was added: %v, %v; want false (use count moved)", ok, err)
	}
	if _, err := a.Reconcile(ctx, map[Table]*TableContent{natT: want}); err != nil {
		t.Fatal(err)
	}
	h.Exec(t, "iptables-nft", "-t", "nat", "-A", "FOREIGN", "-j", "RETURN")
	if ok, err := a.Check(ctx); !ok || err != nil {
		t.Fatalf("Check after a foreign rule: %v, %v; want true", ok, err)
	}
	h.Exec(t, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kt portals", "-j", "KT-K")
	if ok, err := a.Check(ctx); ok || err != nil {
		t.Fatalf("Check after our jump was deleted: %v, %v; want false", ok, err)
	}
	// A commit built on the old generation is refused.
	tx = NewTx()
	tx.SetChain(natT, "KT-A", []Rule{{Target: OrMark(0x1)}})
	if _, err := a.Commit(ctx, tx); !errors.Is(err, ErrGenChanged) {
		t.Fatalf("commit after a foreign change: %v, want ErrGenChanged", err)
	}
	st, err = a.Reconcile(ctx, map[Table]*TableContent{natT: want})
	if err != nil {
		t.Fatal(err)
	}
	if st.Messages != 1 {
		t.Errorf("repair sent %d messages, want 1 (the jump)", st.Messages)
	}
	// Our jump is back at the top, above the foreign one.
	text := want.Text(NAT)
	text.Base = map[string][]Rule{"PREROUTING": append(want.Jumps["PREROUTING"][:1:1], Rule{Target: Jump("FOREIGN")})}
	text.Chains = append(text.Chains, Chain{Name: "FOREIGN", Rules: []Rule{{Target: Return}}})
	if got, w := saveNAT(t, h), string(AppendSaveTable(nil, IPv4, text)); got != w {
		t.Errorf("after repair:\n%s\nwant\n%s", got, w)
	}

	// Cleanup leaves only the foreign chain and rules.
	if err := a.Cleanup(ctx, []Table{natT}); err != nil {
		t.Fatal(err)
	}
	got := saveNAT(t, h)
	wantLeft := "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:FOREIGN - [0:0]\n-A PREROUTING -j FOREIGN\n-A FOREIGN -j RETURN\nCOMMIT\n"
	if got != wantLeft {
		t.Errorf("after cleanup:\n%s\nwant\n%s", got, wantLeft)
	}
}

// TestApplierMangle checks that the Applier creates the mangle table's
// builtin chains as iptables-nft does (OUTPUT a route chain), so that
// iptables-nft shows and extends them as its own, in both families.
func TestApplierMangle(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "xtmangle")
	a := newTestApplier(t, h)
	want := map[Table]*TableContent{}
	for _, f := range []Family{IPv4, IPv6} {
		want[Table{f, Mangle}] = &TableContent{
			Chains: map[string][]Rule{"KT-OUT": {{Target: SetMark{Value: 0x10000, Mask: 0xffffffff}}}},
			Jumps: map[string][]Rule{
				"PREROUTING": {{Matches: []Match{Comment("kt")}, Target: Jump("KT-OUT")}},
				"OUTPUT":     {{Matches: []Match{Comment("kt")}, Target: Jump("KT-OUT")}},
			},
		}
	}
	if _, err := a.Reconcile(ctx, want); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Family{IPv4, IPv6} {
		save, _ := saveCommand(f)
		tool := strings.TrimSuffix(save, "-save")
		h.Exec(t, tool, "-t", "mangle", "-A", "OUTPUT", "-j", "ACCEPT")
		got := StripSave(h.Exec(t, save, "-t", "mangle"))
		text := want[Table{f, Mangle}].Text(Mangle)
		text.Base = map[string][]Rule{"PREROUTING": text.Base["PREROUTING"], "OUTPUT": append(text.Base["OUTPUT"][:1:1], Rule{Target: Accept})}
		if w := string(AppendSaveTable(nil, f, text)); got != w {
			t.Errorf("%s:\n%s\nwant\n%s", save, got, w)
		}
		if out := h.Exec(t, "nft", "list", "chain", f.String(), "mangle", "OUTPUT"); !strings.Contains(out, "type route hook output priority mangle") {
			t.Errorf("mangle OUTPUT is not a route chain:\n%s", out)
		}
	}
	// Foreign rules below ours leave our jumps intact.
	if ok, err := a.Check(ctx); !ok || err != nil {
		t.Fatalf("Check after foreign rules: %v, %v; want true", ok, err)
	}
}

// countingConn counts the rule dumps an Applier makes.
type countingConn struct {
	Conn
	dumps int
}

func (c *countingConn) EachRule(ctx context.Context, fam nfnl.Family, table, chain string, each func(*nfnl.Rule) error) error {
	c.dumps++
	return c.Conn.EachRule(ctx, fam, table, chain, each)
}

// TestApplierVerify: Verify reads the tables back only when someone else
// committed since they were last read whole, and then finds a rule
// changed inside an owned chain, which the cheap check cannot see.
func TestApplierVerify(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "xtverify")
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	cc := &countingConn{Conn: c}
	a := NewApplier(ApplierOptions{Conn: cc, Owns: testOwns})
	want := map[Table]*TableContent{natT: content(1, 2)}
	_, err = a.Reconcile(ctx, want)
	require.NoError(t, err)

	verify := func(what string, wantOK, wantRead bool) {
		t.Helper()
		before := cc.dumps
		ok, err := a.Check(ctx)
		require.NoError(t, err)
		require.True(t, ok, "%s: cheap check", what)
		ok, err = a.Verify(ctx, want)
		require.NoError(t, err)
		assert.Equal(t, wantOK, ok, "%s: verify", what)
		assert.Equal(t, wantRead, cc.dumps > before, "%s: read the rules back", what)
	}
	verify("after a reconcile", true, false)
	tx := NewTx()
	tx.SetKeyed(natT, "KT-K", "key03", []Rule{keyRule("key03", 3)})
	_, err = a.Commit(ctx, tx)
	require.NoError(t, err)
	want[natT].Keyed["KT-K"]["key03"] = []Rule{keyRule("key03", 3)}
	verify("after an own commit", true, false)

	h.Exec(t, "iptables-nft", "-t", "filter", "-N", "FOREIGN")
	verify("after a foreign commit elsewhere", true, true)
	verify("again", true, false)

	h.Exec(t, "iptables-nft", "-t", "nat", "-R", "KT-A", "1", "-j", "MARK", "--or-mark", "0x1")
	verify("after a foreign rule replaced ours", false, true)
	_, err = a.Reconcile(ctx, want)
	require.NoError(t, err)
	verify("after the repair", true, false)
	require.Equal(t, render(want[natT]), saveNAT(t, h))
}

// interruptingConn reports every chain listing as interrupted by another
// writer's commit, as a listing of a big table is while a firewall
// manager commits, and can add a chain the table does not hold.
type interruptingConn struct {
	Conn
	phantom bool
}

func (c *interruptingConn) Chains(ctx context.Context, fam nfnl.Family, table string) ([]nfnl.Chain, error) {
	chains, err := c.Conn.Chains(ctx, fam, table)
	if err != nil {
		return chains, err
	}
	if c.phantom {
		chains = append(chains, nfnl.Chain{Table: table, Name: "KT-PHANTOM"})
	}
	return chains, fmt.Errorf("list chains: %w", nfnl.ErrDumpInterrupted)
}

// TestInterruptedChainListing: a chain listing that another writer's
// commit interrupted is used when the table's object count shows no chain
// came or went (the commit was elsewhere), and refused when the count and
// the listing disagree.
func TestInterruptedChainListing(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "xtintr")
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	want := map[Table]*TableContent{natT: content(1, 2)}
	ic := &interruptingConn{Conn: c}
	a := NewApplier(ApplierOptions{Conn: ic, Owns: testOwns})
	_, err = a.Reconcile(ctx, want)
	require.NoError(t, err, "an interrupted listing of an unchanged table")
	require.Equal(t, render(want[natT]), saveNAT(t, h))

	ic.phantom = true
	b := NewApplier(ApplierOptions{Conn: ic, Owns: testOwns})
	_, err = b.Reconcile(ctx, want)
	require.ErrorIs(t, err, nfnl.ErrDumpInterrupted, "a listing the table's count does not back was used")
}

// countedParts yields groups of chains, each its first chain's, and
// counts the passes over them.
func countedParts(passes *int, groups ...[]Chain) iter.Seq2[any, []Chain] {
	return func(yield func(any, []Chain) bool) {
		*passes++
		for _, g := range groups {
			if !yield(g[0].Name, g) {
				return
			}
		}
	}
}

// Chains made on demand (TableContent.Parts) are written group by group,
// each group's chains created before their rules (KT-S1 jumps to KT-E1,
// after it in its group); a reconcile that finds them as they should be
// makes one pass over them and sends nothing; a changed chain is flushed
// and refilled, a chain no longer made deleted, and Verify compares them
// with the kernel's.
func TestApplierParts(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "xtparts")
	a := newTestApplier(t, h)
	s1 := Chain{Name: "KT-S1", Rules: []Rule{{Matches: []Match{Comment("one")}, Target: Jump("KT-E1")}}}
	e1 := Chain{Name: "KT-E1", Rules: []Rule{{Target: Jump("KT-A")}, {Target: Return}}}
	s2 := Chain{Name: "KT-S2", Rules: []Rule{{Matches: []Match{Comment("two")}, Target: Jump("KT-S1")}}}
	want := content(1)
	want.Keyed["KT-K"]["key01"] = []Rule{{Dst: pfx("10.96.0.1/32"), Target: Jump("KT-S2")}}
	passes := 0
	want.Parts = countedParts(&passes, []Chain{s1, e1}, []Chain{s2})
	reconcile := func(wantMessages int) {
		t.Helper()
		passes = 0
		st, err := a.Reconcile(ctx, map[Table]*TableContent{natT: want})
		require.NoError(t, err)
		if wantMessages == 0 {
			require.Equal(t, 1, passes, "passes over Parts of a reconcile that sends nothing")
		}
		if wantMessages >= 0 {
			require.Equal(t, wantMessages, st.Messages)
		}
		require.Equal(t, render(want), saveNAT(t, h))
	}
	reconcile(-1)
	reconcile(0)
	ok, err := a.Verify(ctx, map[Table]*TableContent{natT: want})
	require.NoError(t, err)
	require.True(t, ok)

	// KT-E1 changed and KT-S2 no longer made (nor jumped to): flush and
	// refill KT-E1 (3 messages), flush and delete KT-S2 (2), the key's
	// rule replaced (2).
	e1.Rules = []Rule{{Target: Return}}
	want.Keyed["KT-K"]["key01"] = []Rule{{Dst: pfx("10.96.0.1/32"), Target: Jump("KT-S1")}}
	want.Parts = countedParts(&passes, []Chain{s1, e1})
	reconcile(7)

	// Someone else's rule in a part: Verify sees it, a reconcile removes it.
	h.Exec(t, "iptables-nft", "-t", "nat", "-A", "KT-E1", "-j", "ACCEPT")
	ok, err = a.Verify(ctx, map[Table]*TableContent{natT: want})
	require.NoError(t, err)
	require.False(t, ok, "Verify with a foreign rule in a part")
	reconcile(2)
}
