//go:build privileged

package nfnl_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

func open(t *testing.T, h *netnstest.Host) *nfnl.Conn {
	t.Helper()
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// ipv4 matches IPv4 packets in an inet table and loads the destination
// address, as nft's "ip daddr" does.
func daddrIs(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func tcpDport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(p >> 8), byte(p)}},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

const tbl = "t"

// sample builds a table with a base chain, regular chains, rules, a plain
// set, an interval set and a verdict map with elements.
func sample() *nfnl.Batch {
	var b nfnl.Batch
	accept := nfnl.VerdictAccept
	b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: tbl})
	b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: tbl, Name: "pre", Hook: &nfnl.Hook{Num: nfnl.HookPrerouting, Priority: -100, Type: "nat", Policy: &accept}})
	b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: tbl, Name: "svc"})
	b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: tbl, Name: "other"})
	b.AddSet(nfnl.Set{Family: nfnl.Inet, Table: tbl, Name: "addrs", KeyType: nfnl.TypeIPv4Addr, KeyLen: 4})
	b.AddSet(nfnl.Set{Family: nfnl.Inet, Table: tbl, Name: "nets", Flags: nfnl.SetInterval, KeyType: nfnl.TypeIPv4Addr, KeyLen: 4})
	b.AddSet(nfnl.Set{Family: nfnl.Inet, Table: tbl, Name: "dispatch", Flags: nfnl.SetMap, KeyType: nfnl.TypeIPv4Addr, KeyLen: 4, DataType: nfnl.TypeVerdict})
	b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "pre", Exprs: cat(daddrIs(netip.MustParseAddr("10.96.0.1")), tcpDport(80), []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "svc"}})})
	b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "pre", Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: "dispatch", IsDestRegSet: true, DestRegister: 0},
	}})
	b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "svc", Exprs: []expr.Any{
		&expr.Numgen{Register: 1, Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	b.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}}})
	b.AddElements(nfnl.Inet, tbl, "nets", []nfnl.Element{
		{Key: []byte{0, 0, 0, 0}, Flags: nfnl.ElemIntervalEnd},
		{Key: []byte{10, 244, 0, 0}}, {Key: []byte{10, 245, 0, 0}, Flags: nfnl.ElemIntervalEnd},
	})
	b.AddElements(nfnl.Inet, tbl, "dispatch", []nfnl.Element{
		{Key: []byte{10, 96, 0, 2}, Verdict: &nfnl.Verdict{Code: nfnl.VerdictGoto, Chain: "other"}},
		{Key: []byte{10, 96, 0, 3}, Verdict: &nfnl.Verdict{Code: nfnl.VerdictDrop}},
	})
	return &b
}

func TestCommitListsBack(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	before, err := c.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gen, err := c.Commit(ctx, sample())
	if err != nil {
		t.Fatal(err)
	}
	if gen.ID != before.ID+1 {
		t.Errorf("generation after commit = %d, want %d", gen.ID, before.ID+1)
	}
	out := h.Exec(t, "nft", "list", "table", "inet", tbl)
	for _, want := range []string{
		"type nat hook prerouting priority dstnat; policy accept;",
		"ip daddr 10.96.0.1 tcp dport 80 jump svc",
		"ip daddr vmap @dispatch",
		"numgen random mod 2 0 counter packets 0 bytes 0 accept",
		"elements = { 10.0.0.1, 10.0.0.2 }",
		"elements = { 10.244.0.0/16 }",
		"10.96.0.2 : goto other",
		"10.96.0.3 : drop",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, out)
		}
	}
	h.Exec(t, "nft", "-j", "list", "table", "inet", tbl)
}

func TestDumpsReadBack(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	b := sample()
	if _, err := c.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	tb, err := c.Table(ctx, nfnl.Inet, tbl)
	if err != nil || tb.Name != tbl || tb.Handle == 0 {
		t.Fatalf("Table = %+v, %v", tb, err)
	}
	if _, err := c.Table(ctx, nfnl.Inet, "missing"); !errors.Is(err, nfnl.ErrNotExist) {
		t.Errorf("Table(missing) error = %v, want ErrNotExist", err)
	}
	chains, err := c.Chains(ctx, nfnl.Inet, tbl)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		names = append(names, ch.Name)
	}
	if got := strings.Join(names, ","); got != "pre,svc,other" {
		t.Errorf("chains = %s", got)
	}
	if chains[0].Hook == nil || chains[0].Hook.Type != "nat" || chains[0].Hook.Priority != -100 {
		t.Errorf("base chain hook = %+v", chains[0].Hook)
	}
	rules, err := c.Rules(ctx, nfnl.Inet, tbl, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 3 {
		t.Fatalf("%d rules, want 3", len(rules))
	}
	want := cat(daddrIs(netip.MustParseAddr("10.96.0.1")), tcpDport(80), []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "svc"}})
	if !nfnl.SameExprs(nfnl.Inet, rules[0].Raw, want) {
		t.Errorf("first rule does not read back as written: %+v", rules[0].Exprs)
	}
	if nfnl.SameExprs(nfnl.Inet, rules[1].Raw, want) {
		t.Error("SameExprs matches two different rules")
	}
	sets, err := c.Sets(ctx, nfnl.Inet, tbl)
	if err != nil || len(sets) != 3 {
		t.Fatalf("Sets = %+v, %v", sets, err)
	}
	els, err := c.Elements(ctx, nfnl.Inet, tbl, "dispatch")
	if err != nil || len(els) != 2 {
		t.Fatalf("Elements = %+v, %v", els, err)
	}
	for _, el := range els {
		if el.Verdict == nil {
			t.Errorf("element %v has no verdict", el.Key)
		}
	}
	n := 0
	if err := c.EachElement(ctx, nfnl.Inet, tbl, "dispatch", func(el *nfnl.Element) error {
		if el.Verdict == nil || !slices.ContainsFunc(els, func(e nfnl.Element) bool { return bytes.Equal(e.Key, el.Key) }) {
			t.Errorf("EachElement gave %+v", el)
		}
		n++
		return nil
	}); err != nil || n != len(els) {
		t.Errorf("EachElement: %d elements, %v", n, err)
	}
	if _, err := c.Elements(ctx, nfnl.Inet, tbl, "missing"); !errors.Is(err, nfnl.ErrNotExist) {
		t.Errorf("Elements(missing) error = %v, want ErrNotExist", err)
	}
}

func TestFailedBatchChangesNothing(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	if _, err := c.Commit(ctx, sample()); err != nil {
		t.Fatal(err)
	}
	before := h.Exec(t, "nft", "list", "ruleset")
	genBefore, _ := c.Generation(ctx)

	var b nfnl.Batch
	b.FlushChain(nfnl.Inet, tbl, "svc")
	b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: tbl, Name: "fresh"})
	b.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 0, 9}}})
	b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "svc", Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: "nowhere"}}})
	b.DelSet(nfnl.Inet, tbl, "dispatch")
	_, err := c.Commit(ctx, &b)
	var ce *nfnl.CommitError
	if !errors.As(err, &ce) {
		t.Fatalf("Commit error = %v, want a *CommitError", err)
	}
	if len(ce.Failed) != 2 {
		t.Fatalf("failed messages = %v, want the bad rule and the set in use", ce.Failed)
	}
	if f := ce.Failed[0]; f.Index != 3 || f.Op != "add rule inet t svc" || f.Errno != syscall.ENOENT {
		t.Errorf("first failure = %+v, want message 3, add rule inet t svc, ENOENT", f)
	}
	if f := ce.Failed[1]; f.Index != 4 || f.Op != "delete set inet t dispatch" || f.Errno != syscall.EBUSY {
		t.Errorf("second failure = %+v, want message 4, delete set inet t dispatch, EBUSY", f)
	}
	if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "add rule inet t svc") {
		t.Errorf("error %q does not name the rule or wrap ENOENT", err)
	}
	if after := h.Exec(t, "nft", "list", "ruleset"); after != before {
		t.Errorf("ruleset changed by a failed batch:\n--- before\n%s\n--- after\n%s", before, after)
	}
	if g, _ := c.Generation(ctx); g.ID != genBefore.ID {
		t.Errorf("generation moved from %d to %d on a failed batch", genBefore.ID, g.ID)
	}
}

func TestRequireGeneration(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	g, err := c.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h.Exec(t, "nft", "add", "table", "inet", "someone-else")
	var b nfnl.Batch
	b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: "mine"})
	b.RequireGeneration(g.ID)
	if _, err := c.Commit(ctx, &b); !errors.Is(err, nfnl.ErrGenerationChanged) {
		t.Fatalf("Commit with a stale generation: %v, want ErrGenerationChanged", err)
	}
	if _, err := c.Table(ctx, nfnl.Inet, "mine"); !errors.Is(err, nfnl.ErrNotExist) {
		t.Errorf("table created despite the stale generation: %v", err)
	}
	g, _ = c.Generation(ctx)
	b.RequireGeneration(g.ID)
	if _, err := c.Commit(ctx, &b); err != nil {
		t.Fatalf("Commit with the current generation: %v", err)
	}
}

// TestLargeBatch sends one batch of several megabytes, beyond the default
// socket buffers.
func TestLargeBatch(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	var b nfnl.Batch
	b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: tbl})
	b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: tbl, Name: "c"})
	b.AddSet(nfnl.Set{Family: nfnl.Inet, Table: tbl, Name: "s", KeyType: nfnl.TypeIPv4Addr, KeyLen: 4})
	const rules = 40000
	for i := range rules {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "c", Exprs: cat(daddrIs(a), tcpDport(uint16(i)), []expr.Any{&expr.Counter{}})})
	}
	els := make([]nfnl.Element, 100000)
	for i := range els {
		els[i].Key = []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}
	}
	b.AddElements(nfnl.Inet, tbl, "s", els)
	if b.Size() < 8<<20 {
		t.Fatalf("batch of %d bytes is too small for this test", b.Size())
	}
	if _, err := c.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	rs, err := c.Rules(ctx, nfnl.Inet, tbl, "c")
	if err != nil || len(rs) != rules {
		t.Fatalf("read back %d rules (%v), want %d", len(rs), err, rules)
	}
	got, err := c.Elements(ctx, nfnl.Inet, tbl, "s")
	if err != nil || len(got) != len(els) {
		t.Fatalf("read back %d elements (%v), want %d", len(got), err, len(els))
	}
}

// TestRulePositions places rules by handle: after, before, and in place of
// existing rules, as the iptables backend does.
func TestRulePositions(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	mark := func(v byte) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: 1, Data: []byte{v, 0, 0, 0}}, &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}
	}
	rule := func(v byte, pos, handle uint64) nfnl.Rule {
		return nfnl.Rule{Family: nfnl.IPv4, Table: "filter", Chain: "c", Exprs: mark(v), Position: pos, Handle: handle}
	}
	var b nfnl.Batch
	b.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "filter"})
	b.AddChain(nfnl.Chain{Family: nfnl.IPv4, Table: "filter", Name: "c"})
	b.AddRule(rule(1, 0, 0))
	b.AddRule(rule(2, 0, 0))
	if _, err := c.Commit(ctx, &b); err != nil {
		t.Fatal(err)
	}
	rs, err := c.Rules(ctx, nfnl.IPv4, "filter", "c")
	if err != nil || len(rs) != 2 {
		t.Fatalf("rules = %v, %v", rs, err)
	}
	first, second := rs[0].Handle, rs[1].Handle
	var b2 nfnl.Batch
	b2.InsertRule(rule(3, second, 0)) // before 2
	b2.AddRule(rule(4, first, 0))     // after 1
	b2.InsertRule(rule(5, 0, 0))      // at the start
	b2.ReplaceRule(rule(6, 0, second))
	if _, err := c.Commit(ctx, &b2); err != nil {
		t.Fatal(err)
	}
	rs, err = c.Rules(ctx, nfnl.IPv4, "filter", "c")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		for v := byte(1); v <= 6; v++ {
			if nfnl.SameExprs(nfnl.IPv4, r.Raw, mark(v)) {
				got = append(got, string('0'+v))
			}
		}
	}
	if s := strings.Join(got, ","); s != "5,1,4,3,6" {
		t.Errorf("rule order = %s, want 5,1,4,3,6", s)
	}
}
