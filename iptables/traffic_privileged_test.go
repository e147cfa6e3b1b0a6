//go:build privileged

package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTrafficClusterIP: new connections to a cluster IP spread over the
// endpoints as their weights say (TCP and UDP); traffic from outside the
// cluster CIDRs is masqueraded, from inside it keeps its source; an
// endpoint reaching itself through the service is masqueraded (hairpin).
func TestTrafficClusterIP(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam, "udp")
		cip := e.pick("10.96.0.10", "fd00:96::10")
		weighted := []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}
		weighted[1].Weight, weighted[2].Weight = servicelb.Weight(2), servicelb.Weight(5)
		one := e.pick("10.96.0.11", "fd00:96::11")
		e.sync(
			servicelb.Service{Name: "t/web", ClusterIPs: []netip.Addr{cip},
				Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort},
					{Name: "dns", Protocol: servicelb.UDP, Port: 53, TargetPort: udpPort}},
				Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}},
			servicelb.Service{Name: "t/weighted", ClusterIPs: []netip.Addr{e.pick("10.96.0.12", "fd00:96::12")},
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort}},
				Endpoints: weighted},
			servicelb.Service{Name: "t/one", ClusterIPs: []netip.Addr{one},
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort}},
				Endpoints: []servicelb.Endpoint{e.endpoint(0, true)}},
		)
		equal := map[string]float64{"backend-0": 1.0 / 3, "backend-1": 1.0 / 3, "backend-2": 1.0 / 3}
		for _, c := range []struct {
			proto string
			port  uint16
		}{{"tcp", 80}, {"udp", 53}} {
			counts := e.tp.Client.Count(t, c.proto, netip.AddrPortFrom(cip, c.port), 300)
			if err := netnstest.WithinBounds(counts, equal, 300); err != nil {
				t.Errorf("%s: %v", c.proto, err)
			}
		}
		counts := e.tp.Client.Count(t, "tcp", netip.AddrPortFrom(e.pick("10.96.0.12", "fd00:96::12"), 80), 400)
		if err := netnstest.WithinBounds(counts, map[string]float64{"backend-0": 1.0 / 8, "backend-1": 2.0 / 8, "backend-2": 5.0 / 8}, 400); err != nil {
			t.Errorf("weights 1:2:5: %v", err)
		}
		// From outside the cluster: masqueraded to the node's address on
		// the backend's link.
		r := e.mustAsk(e.tp.Client, "tcp", one, 80)
		if r.Host != "backend-0" || r.Client.Addr() != e.gateway(e.tp.Backends[0]) {
			t.Errorf("client to cluster IP: %+v, want backend-0 seeing %s", r, e.gateway(e.tp.Backends[0]))
		}
		// From a pod: the source is kept.
		r = e.mustAsk(e.tp.Backends[1], "tcp", one, 80)
		if r.Client.Addr() != e.addr(e.tp.Backends[1]) {
			t.Errorf("pod to cluster IP: backend saw %s, want %s", r.Client.Addr(), e.addr(e.tp.Backends[1]))
		}
		// Hairpin: the only endpoint asks its own service.
		r = e.mustAsk(e.tp.Backends[0], "tcp", one, 80)
		if r.Host != "backend-0" || r.Client.Addr() != e.gateway(e.tp.Backends[0]) {
			t.Errorf("hairpin: %+v, want backend-0 seeing %s", r, e.gateway(e.tp.Backends[0]))
		}
	})
}

// TestTrafficMasqueradeAll: with MasqueradeAll even pod traffic to a
// cluster IP is masqueraded.
func TestTrafficMasqueradeAll(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam)
		e.node.MasqueradeAll = true
		cip := e.pick("10.96.0.10", "fd00:96::10")
		e.sync(servicelb.Service{Name: "t/one", ClusterIPs: []netip.Addr{cip},
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort}},
			Endpoints: []servicelb.Endpoint{e.endpoint(0, true)}})
		r := e.mustAsk(e.tp.Backends[1], "tcp", cip, 80)
		if r.Client.Addr() != e.gateway(e.tp.Backends[0]) {
			t.Errorf("pod to cluster IP with MasqueradeAll: backend saw %s, want %s", r.Client.Addr(), e.gateway(e.tp.Backends[0]))
		}
	})
}

// TestTrafficAffinity: with ClientIP affinity each client sticks to one
// endpoint while it keeps asking within the timeout, and is spread anew
// once the timeout passed.
func TestTrafficAffinity(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam, "udp")
		cip := e.pick("10.96.0.20", "fd00:96::20")
		timeout := 2 * time.Second
		e.sync(servicelb.Service{Name: "t/sticky", ClusterIPs: []netip.Addr{cip},
			Affinity: servicelb.SessionAffinity{ClientIP: true, Timeout: timeout},
			Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort},
				{Name: "dns", Protocol: servicelb.UDP, Port: 53, TargetPort: udpPort}},
			Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}})
		const clients = 30
		var srcs []netip.Addr
		for i := range clients {
			a := e.pick(fmt.Sprintf("198.51.100.%d", 100+i), fmt.Sprintf("fd00:c::%x", 0x100+i))
			e.tp.Client.AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
			srcs = append(srcs, a)
		}
		for _, proto := range []string{"tcp", "udp"} {
			port := map[string]uint16{"tcp": 80, "udp": 53}[proto]
			first := map[netip.Addr]string{}
			seen := map[string]bool{}
			for round := range 4 {
				for _, src := range srcs {
					r := e.mustAsk(e.tp.Client, proto, cip, port, netnstest.FromAddr(src))
					if round == 0 {
						first[src] = r.Host
						seen[r.Host] = true
					} else if r.Host != first[src] {
						t.Fatalf("%s: client %s moved from %s to %s within the affinity timeout", proto, src, first[src], r.Host)
					}
				}
			}
			if len(seen) < 2 {
				t.Errorf("%s: %d clients all landed on %v", proto, clients, seen)
			}
			time.Sleep(timeout + time.Second)
			moved := 0
			for _, src := range srcs {
				if r := e.mustAsk(e.tp.Client, proto, cip, port, netnstest.FromAddr(src)); r.Host != first[src] {
					moved++
				}
			}
			// Each client moves with probability 2/3 once affinity expired;
			// fewer than 5 of 30 happens with probability below 1e-7.
			if moved < 5 {
				t.Errorf("%s: after the timeout only %d of %d clients moved", proto, moved, clients)
			}
		}
	})
}

// TestTrafficNodePortAndPolicies: node ports under the Cluster policy
// reach every endpoint masqueraded; under Local only local endpoints,
// with the client's address kept, and they drop traffic on a node without
// local endpoints. External IPs behave as node ports do. Internal Local
// without local endpoints drops cluster IP traffic.
func TestTrafficNodePortAndPolicies(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam)
		ext := e.pick("192.0.2.100", "fd00:e::100")
		e.sync(
			servicelb.Service{Name: "t/cluster", ClusterIPs: []netip.Addr{e.pick("10.96.0.30", "fd00:96::30")}, ExternalIPs: []netip.Addr{ext},
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30080}},
				Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}},
			servicelb.Service{Name: "t/local", ClusterIPs: []netip.Addr{e.pick("10.96.0.31", "fd00:96::31")},
				ExternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:                 []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30081}},
				Endpoints:             []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false), e.endpoint(2, false)}},
			servicelb.Service{Name: "t/remote-only", ClusterIPs: []netip.Addr{e.pick("10.96.0.32", "fd00:96::32")},
				ExternalTrafficPolicy: servicelb.PolicyLocal, InternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30082}},
				Endpoints: []servicelb.Endpoint{e.endpoint(1, false), e.endpoint(2, false), e.endpoint(0, true)}},
			servicelb.Service{Name: "t/no-local", ClusterIPs: []netip.Addr{e.pick("10.96.0.33", "fd00:96::33")},
				ExternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:                 []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30083}},
				Endpoints:             []servicelb.Endpoint{e.endpoint(1, false)}},
			servicelb.Service{Name: "t/itp-local", ClusterIPs: []netip.Addr{e.pick("10.96.0.34", "fd00:96::34")},
				InternalTrafficPolicy: servicelb.PolicyLocal,
				Ports:                 []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30084}},
				Endpoints:             []servicelb.Endpoint{e.endpoint(1, false)}},
		)
		// The cluster IP of t/itp-local routes to backend 2, which holds it
		// (and refuses port 80), so that only a drop times out.
		itp := e.pick("10.96.0.34", "fd00:96::34")
		e.tp.Backends[2].AddAddress(t, netip.PrefixFrom(itp, itp.BitLen()))
		client := e.addr(e.tp.Client)
		for _, dst := range []netip.AddrPort{netip.AddrPortFrom(e.nodeIP(), 30080), netip.AddrPortFrom(ext, 80)} {
			counts := e.tp.Client.Count(t, "tcp", dst, 240)
			if err := netnstest.WithinBounds(counts, map[string]float64{"backend-0": 1.0 / 3, "backend-1": 1.0 / 3, "backend-2": 1.0 / 3}, 240); err != nil {
				t.Errorf("Cluster policy via %s: %v", dst, err)
			}
			r := e.mustAsk(e.tp.Client, "tcp", dst.Addr(), dst.Port())
			if i := int(r.Host[len(r.Host)-1] - '0'); r.Client.Addr() != e.gateway(e.tp.Backends[i]) {
				t.Errorf("Cluster policy via %s: %s saw %s, want the node's %s", dst, r.Host, r.Client.Addr(), e.gateway(e.tp.Backends[i]))
			}
		}
		// Local: only the local endpoint, the client's address kept.
		counts := e.tp.Client.Count(t, "tcp", netip.AddrPortFrom(e.nodeIP(), 30081), 50)
		if counts["backend-0"] != 50 {
			t.Errorf("Local policy node port: %v, want only backend-0", counts)
		}
		if r := e.mustAsk(e.tp.Client, "tcp", e.nodeIP(), 30081); r.Client.Addr() != client {
			t.Errorf("Local policy node port: backend saw %s, want the client's %s", r.Client.Addr(), client)
		}
		// The node itself reaching a Local node port takes the Cluster path.
		e.mustAsk(e.tp.Node, "tcp", e.nodeIP(), 30081)
		// Both policies Local: the local endpoint serves both.
		if r := e.mustAsk(e.tp.Client, "tcp", e.pick("10.96.0.32", "fd00:96::32"), 80); r.Host != "backend-0" {
			t.Errorf("internal Local: answered by %s, want backend-0", r.Host)
		}
		// Local without local endpoints: node port traffic is dropped,
		// cluster IP traffic still served.
		e.wantErr(e.tp.Client, "tcp", e.nodeIP(), 30083, netnstest.ErrTimeout)
		e.mustAsk(e.tp.Client, "tcp", e.pick("10.96.0.33", "fd00:96::33"), 80)
		// Internal Local without local endpoints: cluster IP traffic is
		// dropped, node port traffic still served.
		e.wantErr(e.tp.Client, "tcp", itp, 80, netnstest.ErrTimeout)
		e.mustAsk(e.tp.Client, "tcp", e.nodeIP(), 30084)
	})
}

// TestTrafficLocalPoliciesRemoteOnly: a service whose traffic policies
// are both Local, on a node without a local endpoint. Its node port drops
// clients outside the cluster, while pods and the node reach the
// cluster's endpoints through it (as if they went out to a load balancer
// and came back): pods with their address kept, the node masqueraded.
// Its cluster IP drops every origin (another node may serve it) and
// refuses none.
func TestTrafficLocalPoliciesRemoteOnly(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam)
		cip := e.pick("10.96.0.35", "fd00:96::35")
		// Backend 2 holds the cluster IP and refuses port 80, so that only
		// a drop times out.
		e.tp.Backends[2].AddAddress(t, netip.PrefixFrom(cip, cip.BitLen()))
		e.sync(servicelb.Service{Name: "t/both-local", ClusterIPs: []netip.Addr{cip},
			InternalTrafficPolicy: servicelb.PolicyLocal, ExternalTrafficPolicy: servicelb.PolicyLocal,
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30085}},
			Endpoints: []servicelb.Endpoint{e.endpoint(1, false)}})
		e.wantErr(e.tp.Client, "tcp", e.nodeIP(), 30085, netnstest.ErrTimeout)
		pod := e.tp.Backends[0]
		r := e.mustAsk(pod, "tcp", e.nodeIP(), 30085)
		assert.Equal(t, "backend-1", r.Host, "pod to the node port")
		assert.Equal(t, e.addr(pod), r.Client.Addr(), "pod to the node port: source kept")
		r = e.mustAsk(e.tp.Node, "tcp", e.nodeIP(), 30085)
		assert.Equal(t, "backend-1", r.Host, "node to the node port")
		assert.Equal(t, e.gateway(e.tp.Backends[1]), r.Client.Addr(), "node to the node port: masqueraded")
		for _, from := range []*netnstest.Host{e.tp.Client, pod, e.tp.Node} {
			e.wantErr(from, "tcp", cip, 80, netnstest.ErrTimeout)
		}
	})
}

// TestTrafficRejectAndDrop: ports without endpoints reject (the client
// sees a refusal at once) on their cluster IP, external IP and node port.
// A cluster IP refuses the ports no service has, from every origin; with
// service CIDRs configured, traffic to an address in them that is no
// cluster IP is dropped, where without them it is routed on.
func TestTrafficRejectAndDrop(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam)
		cip := e.pick("10.96.0.40", "fd00:96::40")
		free := e.pick("10.96.0.49", "fd00:96::49")
		ext := e.pick("192.0.2.140", "fd00:e::140")
		// Backend 2 holds the cluster IP and a free address of the service
		// CIDRs itself and answers on port 81, so that traffic the proxier
		// does not stop reaches a server.
		for _, a := range []netip.Addr{cip, free} {
			e.tp.Backends[2].AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
		}
		e.tp.Backends[2].Serve(t, "tcp", 81)
		empty := servicelb.Service{Name: "t/empty", ClusterIPs: []netip.Addr{e.pick("10.96.0.41", "fd00:96::41")}, ExternalIPs: []netip.Addr{ext},
			Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort, NodePort: 30090}}}
		svc := servicelb.Service{Name: "t/web", ClusterIPs: []netip.Addr{cip},
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort}},
			Endpoints: []servicelb.Endpoint{e.endpoint(0, true)}}
		e.sync(empty, svc)
		e.wantErr(e.tp.Client, "tcp", e.pick("10.96.0.41", "fd00:96::41"), 80, netnstest.ErrRefused)
		e.wantErr(e.tp.Client, "tcp", ext, 80, netnstest.ErrRefused)
		e.wantErr(e.tp.Client, "tcp", e.nodeIP(), 30090, netnstest.ErrRefused)
		// An undefined port of a cluster IP is refused from outside, from
		// a pod and from the node; the free address is routed on.
		for _, from := range []*netnstest.Host{e.tp.Client, e.tp.Backends[1], e.tp.Node} {
			e.wantErr(from, "tcp", cip, 81, netnstest.ErrRefused)
		}
		if r := e.mustAsk(e.tp.Client, "tcp", free, 81); r.Host != "backend-2" {
			t.Fatalf("free address without service CIDRs: answered by %s", r.Host)
		}
		e.node.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
		e.sync(empty, svc)
		e.wantErr(e.tp.Client, "tcp", free, 81, netnstest.ErrTimeout)
		e.wantErr(e.tp.Backends[1], "tcp", free, 81, netnstest.ErrTimeout)
		e.wantErr(e.tp.Client, "tcp", cip, 81, netnstest.ErrRefused)
		if r := e.mustAsk(e.tp.Client, "tcp", cip, 80); r.Host != "backend-0" {
			t.Errorf("defined port with service CIDRs: answered by %s", r.Host)
		}
		// Endpoints appear: the same port is served.
		empty.Endpoints = []servicelb.Endpoint{e.endpoint(1, false)}
		e.sync(empty, svc)
		if r := e.mustAsk(e.tp.Client, "tcp", e.nodeIP(), 30090); r.Host != "backend-1" {
			t.Errorf("node port after endpoints appeared: answered by %s", r.Host)
		}
		// The service goes away: its cluster IP is free, and dropped.
		e.sync(empty)
		e.wantErr(e.tp.Client, "tcp", cip, 81, netnstest.ErrTimeout)
	})
}

// TestTrafficLoadBalancerSourceRanges: a load-balancer IP with source
// ranges admits clients in the ranges, and drops the others (the node
// holds the address, so without the drop the node would refuse the
// connection itself). The node reaching the address it holds is admitted
// when its address lies in the ranges, and dropped when not.
func TestTrafficLoadBalancerSourceRanges(t *testing.T) {
	forFamilies(t, func(t *testing.T, fam servicelb.Family) {
		e := newEnv(t, fam)
		lb := e.pick("203.0.113.10", "fd00:cb::10")
		e.tp.Node.AddAddress(t, netip.PrefixFrom(lb, lb.BitLen()))
		inside := e.pick("198.51.100.50", "fd00:c::50")
		outside := e.pick("198.51.100.150", "fd00:c::150")
		for _, a := range []netip.Addr{inside, outside} {
			e.tp.Client.AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
		}
		ranges := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/26"), netip.MustParsePrefix("fd00:c::/121")}
		e.sync(servicelb.Service{Name: "t/lb", ClusterIPs: []netip.Addr{e.pick("10.96.0.50", "fd00:96::50")},
			LoadBalancerIPs: []netip.Addr{lb}, SourceRanges: ranges,
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 443, TargetPort: tcpPort}},
			Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false)}})
		if _, err := e.ask(e.tp.Client, "tcp", lb, 443, netnstest.FromAddr(inside)); err != nil {
			t.Errorf("client in the source ranges: %v", err)
		}
		if r, err := e.ask(e.tp.Client, "tcp", lb, 443, netnstest.FromAddr(outside)); !errors.Is(err, netnstest.ErrTimeout) {
			t.Errorf("client outside the source ranges: %+v, %v; want a drop", r, err)
		}
		if _, err := e.ask(e.tp.Node, "tcp", lb, 443); err != nil {
			t.Errorf("the node itself, its address in the ranges: %v", err)
		}
		// Ranges without the node's addresses: the node is dropped too.
		narrow := []netip.Prefix{netip.MustParsePrefix("198.51.100.32/27"), netip.MustParsePrefix("fd00:c::40/122")}
		e.sync(servicelb.Service{Name: "t/lb", ClusterIPs: []netip.Addr{e.pick("10.96.0.50", "fd00:96::50")},
			LoadBalancerIPs: []netip.Addr{lb}, SourceRanges: narrow,
			Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 443, TargetPort: tcpPort}},
			Endpoints: []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false)}})
		if _, err := e.ask(e.tp.Client, "tcp", lb, 443, netnstest.FromAddr(inside)); err != nil {
			t.Errorf("client in the narrow source ranges: %v", err)
		}
		e.wantErr(e.tp.Node, "tcp", lb, 443, netnstest.ErrTimeout)
		// Without source ranges everyone gets in.
		e.sync(servicelb.Service{Name: "t/lb", ClusterIPs: []netip.Addr{e.pick("10.96.0.50", "fd00:96::50")},
			LoadBalancerIPs: []netip.Addr{lb},
			Ports:           []servicelb.Port{{Protocol: servicelb.TCP, Port: 443, TargetPort: tcpPort}},
			Endpoints:       []servicelb.Endpoint{e.endpoint(0, true), e.endpoint(1, false)}})
		if _, err := e.ask(e.tp.Client, "tcp", lb, 443, netnstest.FromAddr(outside)); err != nil {
			t.Errorf("no source ranges: %v", err)
		}
	})
}

// TestTrafficStaleUDPFlows: a UDP client that keeps its source port keeps
// its conntrack flow, and with it the endpoint it reached. When that
// endpoint leaves the service, the flow must be cleared so that the next
// datagram reaches a current endpoint; with NoConntrackCleanup it still
// goes to the old one.
func TestTrafficStaleUDPFlows(t *testing.T) {
	for _, clear := range []bool{true, false} {
		t.Run(fmt.Sprintf("clear=%v", clear), func(t *testing.T) {
			forFamilies(t, func(t *testing.T, fam servicelb.Family) {
				netnstest.Require(t, "conntrack")
				e := newEnv(t, fam, "udp")
				if !clear {
					e.px = newProxier(t, e.tp.Node, Options{NoConntrackCleanup: true})
				}
				cip := e.pick("10.96.0.60", "fd00:96::60")
				svc := func(i int) servicelb.Service {
					return servicelb.Service{Name: "t/dns", ClusterIPs: []netip.Addr{cip},
						Ports:     []servicelb.Port{{Protocol: servicelb.UDP, Port: 53, TargetPort: udpPort}},
						Endpoints: []servicelb.Endpoint{e.endpoint(i, true)}}
				}
				e.sync(svc(0))
				from := netnstest.FromPort(40053)
				if r := e.mustAsk(e.tp.Client, "udp", cip, 53, from); r.Host != "backend-0" {
					t.Fatalf("first datagram answered by %s", r.Host)
				}
				e.sync(svc(1))
				want := "backend-1"
				if !clear {
					want = "backend-0"
				}
				if r := e.mustAsk(e.tp.Client, "udp", cip, 53, from); r.Host != want {
					t.Errorf("after backend-0 left: answered by %s, want %s", r.Host, want)
				}
			})
		})
	}
}

// TestTrafficShapes sends packets through the rules of ports whose
// verdicts servicelb does not give today (see TestRenderShapes): each
// origin gets its own verdict. A fourth backend holds the cluster IPs and
// answers on their ports, so that a flow the rules do not stop or
// translate is answered by it.
func TestTrafficShapes(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat", "veth")
	tp := netnstest.New(t, netnstest.Options{Backends: 4})
	for _, b := range tp.Backends {
		b.Serve(t, "tcp", tcpPort)
	}
	holder := tp.Backends[3]
	for _, a := range addrs("10.96.5.1", "10.96.5.2") {
		holder.AddAddress(t, netip.PrefixFrom(a, 32))
	}
	holder.Serve(t, "tcp", 80)
	holder.Serve(t, "tcp", 81)
	px := newProxier(t, tp.Node, Options{Families: []servicelb.Family{servicelb.IPv4}})
	node := shapesNode()
	want, err := px.portsContent(&node, shapesPorts())
	require.NoError(t, err)
	_, err = px.ap.Reconcile(context.Background(), want)
	require.NoError(t, err)
	e := &env{t: t, tp: tp, px: px, node: node, fam: servicelb.IPv4}
	pod := tp.Backends[2]

	// odd/mixed: outside forwarded, pods dropped, the node refused. The
	// node's flows leave from an address of its own outside the cluster
	// CIDRs (on a backend link it has one inside them: its flows would be
	// a pod's).
	fromNode := netnstest.FromAddr(tp.Node.IPv4)
	r := e.mustAsk(tp.Client, "tcp", netip.MustParseAddr("10.96.5.1"), 80)
	assert.Contains(t, []string{"backend-0", "backend-1"}, r.Host, "outside to odd/mixed")
	e.wantErr(pod, "tcp", netip.MustParseAddr("10.96.5.1"), 80, netnstest.ErrTimeout)
	if _, err := e.ask(tp.Node, "tcp", netip.MustParseAddr("10.96.5.1"), 80, fromNode); !errors.Is(err, netnstest.ErrRefused) {
		t.Errorf("node to odd/mixed: %v, want refused", err)
	}

	// odd/masq: outside to the cluster set with its address, pods to the
	// local set with theirs, the node masqueraded.
	for range 10 {
		r = e.mustAsk(pod, "tcp", netip.MustParseAddr("10.96.5.2"), 81)
		require.Equal(t, "backend-0", r.Host, "pod to odd/masq: the local set")
		require.Equal(t, pod.IPv4, r.Client.Addr(), "pod to odd/masq: source kept")
	}
	r = e.mustAsk(tp.Client, "tcp", netip.MustParseAddr("10.96.5.2"), 81)
	assert.Equal(t, tp.Client.IPv4, r.Client.Addr(), "outside to odd/masq: source kept")
	r = e.mustAsk(tp.Node, "tcp", netip.MustParseAddr("10.96.5.2"), 81, fromNode)
	i := int(r.Host[len(r.Host)-1] - '0')
	assert.Equal(t, tp.Backends[i].Gateway4, r.Client.Addr(), "node to odd/masq: masqueraded")
	// The node's address on a backend link lies in the cluster CIDRs: its
	// flows are a pod's, the mark the node's rule set is cleared.
	for range 10 {
		r = e.mustAsk(tp.Node, "tcp", netip.MustParseAddr("10.96.5.2"), 81, netnstest.FromAddr(holder.Gateway4))
		require.Equal(t, "backend-0", r.Host, "node from a cluster CIDR address to odd/masq: the local set")
		require.Equal(t, holder.Gateway4, r.Client.Addr(), "node from a cluster CIDR address to odd/masq: source kept")
	}
}
