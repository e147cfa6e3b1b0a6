//go:build privileged

package nfnl_test

import (
	"bytes"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestRuleIDsRawAndEcho places rules next to rules of the same batch by
// ID, writes expressions given raw (as dumped), and reads handles back
// from echoed messages.
func TestRuleIDsRawAndEcho(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	h := netnstest.NewHost(t, "nfnlid")
	c := open(t, h)
	const fam, table, chain = nfnl.IPv4, "t", "c"
	mark := func(v byte) []expr.Any {
		return []expr.Any{&expr.Immediate{Register: 1, Data: []byte{v, 0, 0, 0}}}
	}
	var b nfnl.Batch
	b.AddTable(nfnl.Table{Family: fam, Name: table})
	b.AddChain(nfnl.Chain{Family: fam, Table: table, Name: chain})
	b.AddRule(nfnl.Rule{Family: fam, Table: table, Chain: chain, ID: 7, Exprs: mark(1)})
	b.InsertRule(nfnl.Rule{Family: fam, Table: table, Chain: chain, PositionID: 7, Exprs: mark(2)})
	b.AddRule(nfnl.Rule{Family: fam, Table: table, Chain: chain, PositionID: 7, Exprs: mark(3)})
	b.Echo(2)
	b.Echo(4)
	b.Echo(0) // not a rule: ignored
	if _, err := c.Commit(ctx(t), &b); err != nil {
		t.Fatal(err)
	}
	rules, err := c.RulesRaw(ctx(t), fam, table, chain)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 3 || rules[0].Exprs != nil {
		t.Fatalf("RulesRaw: %d rules, decoded %v", len(rules), rules[0].Exprs)
	}
	var order []byte
	for _, r := range rules {
		order = append(order, r.Raw[0].Data[len(r.Raw[0].Data)-4])
	}
	if !bytes.Equal(order, []byte{2, 1, 3}) {
		t.Errorf("order %v, want [2 1 3]: inserted before and added after the rule with ID 7", order)
	}
	for _, tc := range []struct {
		msg  int
		want uint64
	}{{2, rules[1].Handle}, {4, rules[2].Handle}} {
		r, ok := b.Echoed(tc.msg)
		if !ok || r.Handle != tc.want || r.Chain != chain {
			t.Errorf("Echoed(%d) = %+v, %v; want handle %d", tc.msg, r, ok, tc.want)
		}
	}
	if _, ok := b.Echoed(3); ok {
		t.Error("Echoed(3) for a message not marked")
	}

	// A dumped rule written back raw lands identical.
	var b2 nfnl.Batch
	b2.AddRule(nfnl.Rule{Family: fam, Table: table, Chain: chain, Raw: rules[0].Raw})
	if _, err := c.Commit(ctx(t), &b2); err != nil {
		t.Fatal(err)
	}
	again, err := c.RulesRaw(ctx(t), fam, table, chain)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 4 || !sameRaw(again[3].Raw, rules[0].Raw) {
		t.Errorf("rule written raw: %+v, want %+v", again[len(again)-1].Raw, rules[0].Raw)
	}

	// EachRule sees the same rules, without copies.
	var seen []nfnl.Rule
	err = c.EachRule(ctx(t), fam, table, chain, func(r *nfnl.Rule) error {
		cp := *r
		cp.Raw = nil
		for _, x := range r.Raw {
			cp.Raw = append(cp.Raw, nfnl.RawExpr{Name: x.Name, Data: bytes.Clone(x.Data)})
		}
		seen = append(seen, cp)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(again) {
		t.Fatalf("EachRule saw %d rules, RulesRaw %d", len(seen), len(again))
	}
	for i := range seen {
		if seen[i].Handle != again[i].Handle || seen[i].Chain != chain || !sameRaw(seen[i].Raw, again[i].Raw) {
			t.Errorf("EachRule rule %d: %+v, want %+v", i, seen[i], again[i])
		}
	}
}

func sameRaw(a, b []nfnl.RawExpr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}
