//go:build vm

package conntrack_test

import (
	"net/netip"
	"testing"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestDeleteStaleSCTP deletes the flow of a removed SCTP endpoint behind a
// DNATed VIP, over IPv4 and IPv6, and keeps another endpoint's flow.
func TestDeleteStaleSCTP(t *testing.T) {
	netnstest.Require(t, "sctp", "nf_tables", "nat", "conntrack")
	tp := netnstest.New(t, netnstest.Options{Backends: 2})
	for _, b := range tp.Backends {
		b.Serve(t, "sctp", 9000)
	}
	tp.Node.ExecInput(t, `
table ip kpt_ct {
	chain pre {
		type nat hook prerouting priority -100;
		ip daddr 10.96.0.20 sctp dport 90 dnat to 10.244.1.2:9000
		ip daddr 10.96.0.21 sctp dport 90 dnat to 10.244.2.2:9000
	}
}
table ip6 kpt_ct {
	chain pre {
		type nat hook prerouting priority -100;
		ip6 daddr fd00:96::20 sctp dport 90 dnat to [fd00:244:1::2]:9000
	}
}`, "nft", "-f", "-")
	vips := []netip.AddrPort{
		netip.MustParseAddrPort("10.96.0.20:90"), netip.MustParseAddrPort("10.96.0.21:90"),
		netip.MustParseAddrPort("[fd00:96::20]:90"),
	}
	for _, dst := range vips {
		if _, err := tp.Client.Ask(t.Context(), "sctp", dst); err != nil {
			t.Fatalf("sctp %s: %v", dst, err)
		}
	}
	c, err := conntrack.New(conntrack.Options{NetNS: tp.Node.NS})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := c.DeleteStale(t.Context(), []servicelb.StaleFlow{
		{Protocol: servicelb.SCTP, Dst: vips[0].Addr(), Port: 90, Serving: []netip.AddrPort{netip.MustParseAddrPort("10.244.2.2:9000")}},
		{Protocol: servicelb.SCTP, Dst: vips[2].Addr(), Port: 90},
	})
	if err != nil || n != 2 {
		t.Fatalf("DeleteStale: %d, %v; want 2", n, err)
	}
	left := map[netip.AddrPort]int{}
	for _, f := range []servicelb.Family{servicelb.IPv4, servicelb.IPv6} {
		flows, err := c.List(t.Context(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range flows {
			if fl.Protocol == 132 {
				left[fl.Orig.Dst]++
			}
		}
	}
	if left[vips[0]] != 0 || left[vips[2]] != 0 || left[vips[1]] != 1 {
		t.Errorf("SCTP flows left per VIP: %v; want only %s's", left, vips[1])
	}
	if out := tp.Node.Exec(t, "conntrack", "-L", "-p", "sctp", "--orig-dst", "10.96.0.21"); out == "" {
		t.Errorf("conntrack -L no longer shows the kept SCTP flow")
	}
}
