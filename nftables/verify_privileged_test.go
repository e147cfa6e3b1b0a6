//go:build privileged || vm

package nftables

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestWrittenTableVerifies: every rule, set and element the proxier writes
// reads back as what it meant to write, so that another writer's commit
// elsewhere never makes it rewrite its table.
func TestWrittenTableVerifies(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "verify")
	p, err := New(Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	node := servicelb.NodeConfig{
		NodeName: "node", NodeIPs: []netip.Addr{netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("fd00:c::1")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("0.0.0.0/0")},
	}
	ep := func(a string, node string) servicelb.Endpoint {
		return servicelb.Endpoint{Addr: netip.MustParseAddr(a), NodeName: node}
	}
	st, err := servicelb.NewState(node,
		servicelb.Service{Name: "a/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:96::1")},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")},
			SourceRanges:    []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:1::/48")},
			Ports: []servicelb.Port{{Name: "t", Protocol: servicelb.TCP, Port: 80, NodePort: 30001},
				{Name: "u", Protocol: servicelb.UDP, Port: 53}, {Name: "s", Protocol: servicelb.SCTP, Port: 9}},
			ExternalTrafficPolicy: servicelb.PolicyLocal, InternalTrafficPolicy: servicelb.PolicyLocal,
			Endpoints: []servicelb.Endpoint{ep("10.244.1.2", "node"), ep("10.244.2.2", "x"), ep("fd00:244:1::2", "node")}},
		servicelb.Service{Name: "a/sticky", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.2"), netip.MustParseAddr("fd00:96::2")},
			Affinity: servicelb.SessionAffinity{ClientIP: true, Timeout: 90 * time.Second},
			Ports:    []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}},
			Endpoints: []servicelb.Endpoint{ep("10.244.1.3", ""), ep("10.244.2.3", ""), ep("10.244.3.3", ""),
				ep("fd00:244:1::3", "")}},
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, all := range []bool{false, true} {
		node.MasqueradeAll = all
		ed := st.Edit()
		if err := ed.SetNode(node); err != nil {
			t.Fatal(err)
		}
		if err := servicetest.SyncErr(p.Sync(ctx, ed.State())); err != nil {
			t.Fatal(err)
		}
		if why, err := p.verify(ctx, p.plan.content(p.model)); err != nil || why != "" {
			t.Errorf("masquerade all %v: table does not verify: %q, %v", all, why, err)
		}
	}
}
