//go:build vm

package iptables

import (
	"net/netip"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTrafficSCTP needs SCTP sockets, which only the VM kernel has: new
// SCTP associations to a cluster IP spread over the endpoints and are
// masqueraded from outside the cluster; a node port under the Local
// policy reaches only the local endpoint with the client's address kept;
// a port without endpoints refuses.
func TestTrafficSCTP(t *testing.T) {
	netnstest.Require(t, "sctp")
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam, "sctp")
		cip := e.pick("10.96.0.70", "fd00:96::70")
		empty := e.pick("10.96.0.71", "fd00:96::71")
		e.sync(
			servicelb.Service{Name: "t/diameter", ClusterIPs: []netip.Addr{cip},
				Ports:     []servicelb.Port{{Protocol: servicelb.SCTP, Port: 3868, TargetPort: sctpPort, NodePort: 30868}},
				Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}},
			servicelb.Service{Name: "t/local", ClusterIPs: []netip.Addr{e.pick("10.96.0.72", "fd00:96::72")},
				ExternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:                 []servicelb.Port{{Protocol: servicelb.SCTP, Port: 3868, TargetPort: sctpPort, NodePort: 30869}},
				Endpoints:             []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false)}},
			servicelb.Service{Name: "t/empty", ClusterIPs: []netip.Addr{empty},
				Ports: []servicelb.Port{{Protocol: servicelb.SCTP, Port: 3868, TargetPort: sctpPort}}},
		)
		counts := e.tp.Client.Count(t, "sctp", netip.AddrPortFrom(cip, 3868), 210)
		if err := netnstest.WithinBounds(counts, map[string]float64{"backend-0": 1.0 / 3, "backend-1": 1.0 / 3, "backend-2": 1.0 / 3}, 210); err != nil {
			t.Error(err)
		}
		r := e.mustAsk(e.tp.Client, "sctp", cip, 3868)
		if i := int(r.Host[len(r.Host)-1] - '0'); r.Client.Addr() != e.gateway(e.tp.Backends[i]) {
			t.Errorf("SCTP to the cluster IP: %s saw %s, want the node's %s", r.Host, r.Client.Addr(), e.gateway(e.tp.Backends[i]))
		}
		e.mustAsk(e.tp.Client, "sctp", e.nodeIP(), 30868)
		for range 10 {
			r := e.mustAsk(e.tp.Client, "sctp", e.nodeIP(), 30869)
			if r.Host != "backend-0" || r.Client.Addr() != e.addr(e.tp.Client) {
				t.Fatalf("SCTP Local node port: %+v, want backend-0 seeing the client's address", r)
			}
		}
		e.wantErr(e.tp.Client, "sctp", empty, 3868, netnstest.ErrRefused)
	})
}
