//go:build vm

package nftables_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestSCTP: SCTP services spread over their endpoints through the cluster
// IP and the node port, over IPv4 and IPv6, are masqueraded from outside
// the cluster, and refuse (ABORT or ICMP unreachable) without endpoints.
func TestSCTP(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat", "sctp")
	tp := netnstest.New(t, netnstest.Options{Backends: 3})
	const port = 9000
	var eps []servicelb.Endpoint
	for i, b := range tp.Backends {
		b.Serve(t, "sctp", port)
		eps = append(eps, servicelb.Endpoint{Addr: netnstest.BackendIPv4(i)},
			servicelb.Endpoint{Addr: netnstest.BackendIPv6(i)})
	}
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: tp.NodeIPs(), ClusterCIDRs: netnstest.ClusterCIDRs()}
	svc := servicelb.Service{
		Name: "default/sig", ClusterIPs: []netip.Addr{clusterIP4, clusterIP6},
		Ports:     []servicelb.Port{{Protocol: servicelb.SCTP, Port: 38412, NodePort: 30412, TargetPort: port}},
		Endpoints: eps,
	}
	p := newProxier(t, tp.Node, nftables.Options{})
	mustSync(t, p, mustState(t, node, svc))
	const n = 150
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(clusterIP4, 38412), netip.AddrPortFrom(clusterIP6, 38412),
		netip.AddrPortFrom(netnstest.NodeIPv4(), 30412), netip.AddrPortFrom(netnstest.NodeIPv6(), 30412),
	} {
		counts := tp.Client.Count(t, "sctp", dst, n)
		if err := netnstest.WithinBounds(counts, netnstest.EvenShares("backend-0", "backend-1", "backend-2"), n); err != nil {
			t.Errorf("sctp %s: %v", dst, err)
		}
		r, err := tp.Client.Ask(t.Context(), "sctp", dst)
		if err != nil {
			t.Fatal(err)
		}
		if r.Client.Addr() == tp.Client.IPv4 || r.Client.Addr() == tp.Client.IPv6 {
			t.Errorf("sctp %s: the backend saw the client's own address %s, want the node's", dst, r.Client.Addr())
		}
	}
	svc.Endpoints = nil
	mustSync(t, p, mustState(t, node, svc))
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 38412), netip.AddrPortFrom(clusterIP6, 38412)} {
		if _, err := tp.Client.Ask(t.Context(), "sctp", dst); !errors.Is(err, netnstest.ErrRefused) {
			t.Errorf("sctp %s without endpoints: %v, want refused", dst, err)
		}
	}
}
