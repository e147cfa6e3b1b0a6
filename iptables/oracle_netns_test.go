//go:build privileged || vm

package iptables

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestOracle syncs a rich state (also under each local-traffic
// detection) and checks it three ways: iptables-nft-save shows exactly
// Render's text; loading Render's text with iptables-nft-restore into a
// fresh namespace gives the same nf_tables expressions as ours; and
// syncing the same state again sends nothing.
func TestOracle(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	type oracleCase struct {
		name, prefix string
		st           *servicelb.State
	}
	localhost := richNode()
	localhost.LocalhostNodePorts = true
	withLocalhost, err := servicelb.NewState(localhost, richServices()...)
	if err != nil {
		t.Fatal(err)
	}
	cases := []oracleCase{{"prefix=", "", richState(t)}, {"prefix=KUBE-", "KUBE-", richState(t)}, {"localhost node ports", "", withLocalhost}}
	for name, st := range detectStates(t) {
		cases = append(cases, oracleCase{name, "", st})
	}
	for _, tc := range cases {
		prefix, st := tc.prefix, tc.st
		t.Run(tc.name, func(t *testing.T) {
			h := netnstest.NewHost(t, "ipt")
			cc := &countingConn{}
			px := newProxier(t, h, Options{ChainPrefix: prefix})
			cc.Conn, px.conn = px.conn, cc
			px.ap = newApplier(px, cc)
			if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
				t.Fatal(err)
			}
			fresh := netnstest.NewHost(t, "iptr")
			for _, f := range families {
				want, err := px.RenderFamily(st, f)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, saved(t, h, f)); diff != "" {
					t.Errorf("%s differs from Render (-render +saved):\n%s", saveCmd(f), diff)
				}
				fresh.ExecInput(t, want, restoreCmd(f))
				if diff := cmp.Diff(want, saved(t, fresh, f)); diff != "" {
					t.Errorf("%s of the restored text differs (-render +saved):\n%s", saveCmd(f), diff)
				}
			}
			ours, theirs := nftRules(t, h), nftRules(t, fresh)
			if len(ours) < 20 {
				t.Fatalf("only %d chains with rules listed", len(ours))
			}
			if diff := cmp.Diff(theirs, ours); diff != "" {
				t.Errorf("nft expressions differ (-iptables-nft-restore +ours):\n%s", diff)
			}
			batches := cc.batches
			if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
				t.Fatal(err)
			}
			if cc.batches != batches {
				t.Errorf("syncing the same state sent %d batches", cc.batches-batches)
			}
		})
	}
}

// TestCoexistence runs two Proxiers with different prefixes and a foreign
// ruleset in one namespace: each keeps its own chains, Cleanup of one
// leaves the other and the foreign rules exactly as they were.
func TestCoexistence(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptco")
	foreign := "*nat\n:FOREIGN - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n-A PREROUTING -j FOREIGN\n-A FOREIGN -d 192.0.2.1/32 -j RETURN\nCOMMIT\n" +
		"*filter\n:KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -m mark --mark 0x8000/0x8000 -j DROP\nCOMMIT\n"
	h.ExecInput(t, foreign, "iptables-nft-restore", "--noflush")
	before := saved(t, h, servicelb.IPv4)

	st := richState(t)
	a := newProxier(t, h, Options{ChainPrefix: "KUBE-", Families: []servicelb.Family{servicelb.IPv4}})
	b := newProxier(t, h, Options{ChainPrefix: "KUBE-X-", Families: []servicelb.Family{servicelb.IPv4}, DropBit: 16})
	for _, px := range []*Proxier{a, b, a} {
		if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
			t.Fatal(err)
		}
	}
	both := saved(t, h, servicelb.IPv4)
	for _, want := range []string{"-A KUBE-SERVICES ", "-A KUBE-X-SERVICES ", "-A FOREIGN -d 192.0.2.1/32 -j RETURN", "-A KUBE-FIREWALL -m mark"} {
		if !strings.Contains(both, want) {
			t.Errorf("missing %q after both synced", want)
		}
	}
	if err := b.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	ra, err := a.RenderFamily(st, servicelb.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	// Only a's rules and the foreign ones are left: what a renders plus the
	// foreign lines.
	left := saved(t, h, servicelb.IPv4)
	if got, want := lines(left), lines(ra+foreign); !slices.Equal(got, want) {
		t.Errorf("after b's cleanup (-want +got):\n%s", cmp.Diff(want, got))
	}
	if err := a.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if got := saved(t, h, servicelb.IPv4); !slices.Equal(lines(got), lines(before)) {
		t.Errorf("after both cleanups (-before +after):\n%s", cmp.Diff(lines(before), lines(got)))
	}
}

// TestOracleShapes writes the rules of ports whose verdicts servicelb
// does not give today (see TestRenderShapes) and checks them as
// TestOracle does: iptables-nft-save shows Render's text, and
// iptables-nft-restore of that text writes the same expressions.
func TestOracleShapes(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	ctx := context.Background()
	h := netnstest.NewHost(t, "iptshape")
	px := newProxier(t, h, Options{Families: []servicelb.Family{servicelb.IPv4}})
	node := shapesNode()
	want, err := px.portsContent(&node, shapesPorts())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := px.ap.Reconcile(ctx, want); err != nil {
		t.Fatal(err)
	}
	text, err := renderFamily(want, servicelb.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(text, saved(t, h, servicelb.IPv4)); diff != "" {
		t.Errorf("iptables-nft-save differs from Render (-render +saved):\n%s", diff)
	}
	fresh := netnstest.NewHost(t, "iptshaper")
	fresh.ExecInput(t, text, restoreCmd(servicelb.IPv4))
	if diff := cmp.Diff(text, saved(t, fresh, servicelb.IPv4)); diff != "" {
		t.Errorf("iptables-nft-save of the restored text differs (-render +saved):\n%s", diff)
	}
	if diff := cmp.Diff(nftRules(t, fresh), nftRules(t, h)); diff != "" {
		t.Errorf("nft expressions differ (-iptables-nft-restore +ours):\n%s", diff)
	}
}
