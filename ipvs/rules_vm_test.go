//go:build vm

package ipvs

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// askFrom asks dst from host h once and returns the reply, failing the
// test on error.
func askFrom(t *testing.T, h *netnstest.Host, proto string, dst netip.AddrPort, opts ...netnstest.AskOption) netnstest.Reply {
	t.Helper()
	r, err := h.Ask(t.Context(), proto, dst, opts...)
	if err != nil {
		t.Fatalf("%s asks %s %s: %v", h.Name, proto, dst, err)
	}
	return r
}

// wantFailure checks that asks fail with kind (netnstest.ErrRefused for a
// rejection, netnstest.ErrTimeout for a drop).
func wantFailure(t *testing.T, h *netnstest.Host, proto string, dst netip.AddrPort, kind error, opts ...netnstest.AskOption) {
	t.Helper()
	for range 2 {
		r, err := h.Ask(t.Context(), proto, dst, opts...)
		if !errors.Is(err, kind) {
			t.Fatalf("%s asks %s %s: %v, %v; want %v", h.Name, proto, dst, r, err, kind)
		}
	}
}

// gateway returns the node's address on backend i's link, of dst's family:
// the source a masqueraded request arrives from.
func (e *env) gateway(i int, dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return e.tp.Backends[i].Gateway4
	}
	return e.tp.Backends[i].Gateway6
}

// clientAddr returns the client's address of dst's family.
func (e *env) clientAddr(dst netip.Addr) netip.Addr {
	if dst.Is4() {
		return e.tp.Client.IPv4
	}
	return e.tp.Client.IPv6
}

// TestMasquerade checks who is masqueraded: traffic to a cluster IP from
// outside the cluster CIDRs and external Cluster traffic are; traffic to
// a cluster IP from inside is not, unless the node masquerades all.
func TestMasquerade(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serve("tcp", 8080, 0)
	e.serve("udp", 5353, 0)
	svc := multiService()
	svc.Ports = svc.Ports[:2]
	svc.Endpoints = endpoints(0)
	e.sync(e.state(svc))
	for _, cip := range []netip.Addr{a("10.96.0.10"), a("fd00:96::10")} {
		for _, q := range []struct {
			proto string
			port  uint16
		}{{"tcp", 80}, {"udp", 53}} {
			if r := askFrom(t, e.tp.Client, q.proto, ap(cip, q.port)); r.Client.Addr() != e.gateway(0, cip) {
				t.Errorf("client to %s/%s: seen from %s, want masqueraded to %s", cip, q.proto, r.Client, e.gateway(0, cip))
			}
			if r := askFrom(t, e.tp.Backends[1], q.proto, ap(cip, q.port)); r.Client.Addr() != backendAddr(1, servicelb.FamilyOf(cip)) {
				t.Errorf("backend-1 to %s/%s: seen from %s, want its own address", cip, q.proto, r.Client)
			}
		}
	}
	for _, nip := range e.tp.NodeIPs() {
		if r := askFrom(t, e.tp.Client, "tcp", ap(nip, 30080)); r.Client.Addr() != e.gateway(0, nip) {
			t.Errorf("client to node port %s: seen from %s, want masqueraded", nip, r.Client)
		}
	}
	e.node.MasqueradeAll = true
	e.sync(e.state(svc))
	if r := askFrom(t, e.tp.Backends[1], "tcp", ap(a("10.96.0.10"), 80)); r.Client.Addr() != e.gateway(0, a("10.96.0.10")) {
		t.Errorf("MasqueradeAll: backend-1 seen from %s, want masqueraded", r.Client)
	}
}

// localService is a service with every kind of external address: backend 0
// runs on this node, backend 1 elsewhere.
func localService(ext, internal servicelb.TrafficPolicy, local bool) servicelb.Service {
	eps := endpoints(0, 1)
	for i := range eps {
		if !local || i >= 2 {
			eps[i].NodeName = "other"
		}
	}
	return servicelb.Service{
		Name:                  "default/local",
		ClusterIPs:            []netip.Addr{a("10.96.0.50"), a("fd00:96::50")},
		ExternalIPs:           []netip.Addr{a("203.0.113.50"), a("2001:db8::50")},
		LoadBalancerIPs:       []netip.Addr{a("203.0.113.150"), a("2001:db8::150")},
		Ports:                 []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30050, TargetPort: 8080}},
		ExternalTrafficPolicy: ext,
		InternalTrafficPolicy: internal,
		Endpoints:             eps,
	}
}

// externalDsts are the external destinations of localService.
func (e *env) externalDsts() []netip.AddrPort {
	var out []netip.AddrPort
	for _, x := range []string{"203.0.113.50", "2001:db8::50", "203.0.113.150", "2001:db8::150"} {
		out = append(out, ap(a(x), 80))
	}
	for _, nip := range e.tp.NodeIPs() {
		out = append(out, ap(nip, 30050))
	}
	return out
}

// TestExternalTrafficPolicy checks that external Local traffic reaches only
// local endpoints with the client's address kept, is dropped without local
// endpoints while the cluster IP still serves, and that external Cluster
// traffic reaches every endpoint, masqueraded.
func TestExternalTrafficPolicy(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serve("tcp", 8080, 0, 1)
	e.sync(e.state(localService(servicelb.PolicyLocal, servicelb.PolicyCluster, true)))
	for _, dst := range e.externalDsts() {
		counts := e.tp.Client.Count(t, "tcp", dst, 4)
		if counts["backend-0"] != 4 {
			t.Errorf("Local %s: answers %v, want backend-0 only", dst, counts)
		}
		if r := askFrom(t, e.tp.Client, "tcp", dst); r.Client.Addr() != e.clientAddr(dst.Addr()) {
			t.Errorf("Local %s: seen from %s, want the client's address", dst, r.Client)
		}
	}
	e.sync(e.state(localService(servicelb.PolicyLocal, servicelb.PolicyCluster, false)))
	for _, dst := range e.externalDsts() {
		wantFailure(t, e.tp.Client, "tcp", dst, netnstest.ErrTimeout)
	}
	if counts := e.tp.Client.Count(t, "tcp", ap(a("10.96.0.50"), 80), 4); len(counts) != 2 {
		t.Errorf("cluster IP without local endpoints: answers %v, want both backends", counts)
	}
	e.sync(e.state(localService(servicelb.PolicyCluster, servicelb.PolicyCluster, false)))
	for _, dst := range e.externalDsts() {
		if counts := e.tp.Client.Count(t, "tcp", dst, 4); len(counts) != 2 {
			t.Errorf("Cluster %s: answers %v, want both backends", dst, counts)
		}
		r := askFrom(t, e.tp.Client, "tcp", dst)
		i := e.backendIndex(r.Host)
		if r.Client.Addr() != e.gateway(i, dst.Addr()) {
			t.Errorf("Cluster %s: seen from %s, want masqueraded", dst, r.Client)
		}
	}
}

// TestInternalTrafficPolicy checks that internal Local traffic reaches only
// local endpoints and is dropped without them, from every origin, while
// external traffic (Cluster) still reaches every endpoint.
func TestInternalTrafficPolicy(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serve("tcp", 8080, 0, 1)
	e.sync(e.state(localService(servicelb.PolicyCluster, servicelb.PolicyLocal, true)))
	for _, cip := range []netip.Addr{a("10.96.0.50"), a("fd00:96::50")} {
		if counts := e.tp.Backends[1].Count(t, "tcp", ap(cip, 80), 4); counts["backend-0"] != 4 {
			t.Errorf("internal Local %s: answers %v, want backend-0 only", cip, counts)
		}
	}
	e.sync(e.state(localService(servicelb.PolicyCluster, servicelb.PolicyLocal, false)))
	for _, cip := range []netip.Addr{a("10.96.0.50"), a("fd00:96::50")} {
		wantFailure(t, e.tp.Backends[1], "tcp", ap(cip, 80), netnstest.ErrTimeout)
		wantFailure(t, e.tp.Client, "tcp", ap(cip, 80), netnstest.ErrTimeout)
		wantFailure(t, e.tp.Node, "tcp", ap(cip, 80), netnstest.ErrTimeout)
	}
	if counts := e.tp.Client.Count(t, "tcp", ap(netnstest.NodeIPv4(), 30050), 4); len(counts) != 2 {
		t.Errorf("node port: answers %v, want both backends", counts)
	}
}

// TestHairpin checks that an endpoint reaching itself through its service
// gets an answer, masqueraded to the node's address.
func TestHairpin(t *testing.T) {
	e := newEnv(t, 1, Options{})
	e.serve("tcp", 8080, 0)
	e.serve("udp", 5353, 0)
	svc := multiService()
	svc.Ports = svc.Ports[:2]
	svc.Endpoints = endpoints(0)
	e.sync(e.state(svc))
	for _, cip := range []netip.Addr{a("10.96.0.10"), a("fd00:96::10")} {
		for _, q := range []struct {
			proto string
			port  uint16
		}{{"tcp", 80}, {"udp", 53}} {
			r := askFrom(t, e.tp.Backends[0], q.proto, ap(cip, q.port))
			if r.Client.Addr() != e.gateway(0, cip) {
				t.Errorf("hairpin %s/%s: seen from %s, want masqueraded to %s", cip, q.proto, r.Client, e.gateway(0, cip))
			}
		}
	}
}

// TestSourceRanges checks that a load-balancer IP with source ranges
// answers the allowed sources and drops everyone else, the node and pods
// included: the node only when its address lies in the ranges (its flows
// to a load-balancer IP it holds come from that IP), each family by its
// own ranges, and only on load-balancer IPs.
func TestSourceRanges(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serve("tcp", 8080, 0)
	svc := localService(servicelb.PolicyCluster, servicelb.PolicyCluster, true)
	svc.Endpoints = endpoints(0)
	other4, other6 := a("198.51.100.77"), a("fd00:c::77")
	e.tp.Client.AddAddress(t, netip.PrefixFrom(other4, 24))
	e.tp.Client.AddAddress(t, netip.PrefixFrom(other6, 64))
	other := func(lb netip.Addr) netip.Addr {
		if lb.Is4() {
			return other4
		}
		return other6
	}
	lbs := []netip.Addr{a("203.0.113.150"), a("2001:db8::150")}
	pod := e.tp.Backends[1]

	// The client's addresses only: the node and pods are not admitted.
	svc.SourceRanges = []netip.Prefix{pfx("198.51.100.2/32"), pfx("fd00:c::2/128")}
	e.sync(e.state(svc))
	for _, lb := range lbs {
		askFrom(t, e.tp.Client, "tcp", ap(lb, 80), netnstest.FromAddr(e.clientAddr(lb)))
		wantFailure(t, e.tp.Client, "tcp", ap(lb, 80), netnstest.ErrTimeout, netnstest.FromAddr(other(lb)))
		wantFailure(t, e.tp.Node, "tcp", ap(lb, 80), netnstest.ErrTimeout)
		wantFailure(t, pod, "tcp", ap(lb, 80), netnstest.ErrTimeout)
		// The ranges limit only the load-balancer IP.
		askFrom(t, e.tp.Client, "tcp", ap(a("10.96.0.50"), 80), netnstest.FromAddr(other4))
		askFrom(t, e.tp.Node, "tcp", ap(e.tp.NodeIPs()[0], 30050))
	}

	// The node's subnet: the node is admitted, through the load-balancer
	// IPs themselves as sources.
	svc.SourceRanges = []netip.Prefix{pfx("198.51.100.0/24"), pfx("fd00:c::/64")}
	e.sync(e.state(svc))
	for _, lb := range lbs {
		askFrom(t, e.tp.Node, "tcp", ap(lb, 80))
		askFrom(t, e.tp.Client, "tcp", ap(lb, 80), netnstest.FromAddr(other(lb)))
		wantFailure(t, pod, "tcp", ap(lb, 80), netnstest.ErrTimeout)
	}

	// Ranges of one family leave the other open, to everyone.
	svc.SourceRanges = []netip.Prefix{pfx("198.51.100.2/32")}
	e.sync(e.state(svc))
	wantFailure(t, e.tp.Client, "tcp", ap(lbs[0], 80), netnstest.ErrTimeout, netnstest.FromAddr(other4))
	wantFailure(t, e.tp.Node, "tcp", ap(lbs[0], 80), netnstest.ErrTimeout)
	askFrom(t, e.tp.Client, "tcp", ap(lbs[1], 80), netnstest.FromAddr(other6))
	askFrom(t, e.tp.Node, "tcp", ap(lbs[1], 80))
	askFrom(t, pod, "tcp", ap(lbs[1], 80))
}

// TestExternalLocalFromPodAndNode checks the external Local policy's
// verdicts for pods and the node: on every external frontend, with and
// without a local endpoint, a pod reaches every endpoint with its own
// address and the node every endpoint masqueraded, while a client
// outside reaches only the local endpoint, or nothing.
func TestExternalLocalFromPodAndNode(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1)
	e.serve("udp", 5353, 0, 1)
	pod := e.tp.Backends[2]
	svc := func(local bool) servicelb.Service {
		s := localService(servicelb.PolicyLocal, servicelb.PolicyCluster, local)
		s.Ports = append(s.Ports, servicelb.Port{Name: "dns", Protocol: udp, Port: 53, NodePort: 30053, TargetPort: 5353})
		s.Ports[0].Name = "http"
		return s
	}
	for _, local := range []bool{true, false} {
		e.sync(e.state(svc(local)))
		for _, dst := range e.externalDsts() {
			if local {
				if counts := e.tp.Client.Count(t, "tcp", dst, 4); counts["backend-0"] != 4 {
					t.Errorf("outside to %s: answers %v, want backend-0 only", dst, counts)
				}
			} else {
				wantFailure(t, e.tp.Client, "tcp", dst, netnstest.ErrTimeout)
			}
			for _, q := range []struct {
				proto string
				dst   netip.AddrPort
			}{{"tcp", dst}, {"udp", ap(dst.Addr(), map[uint16]uint16{80: 53, 30050: 30053}[dst.Port()])}} {
				e.wantSpread(pod, q.proto, q.dst, false)
				e.wantSpread(e.tp.Node, q.proto, q.dst, true)
			}
		}
	}
}

// wantSpread checks that asks from h to dst reach backends 0 and 1 evenly
// (round robin), masqueraded or with h's own address.
func (e *env) wantSpread(h *netnstest.Host, proto string, dst netip.AddrPort, masqueraded bool) {
	e.t.Helper()
	if counts := h.Count(e.t, proto, dst, 4); counts["backend-0"] != 2 || counts["backend-1"] != 2 {
		e.t.Errorf("%s to %s %s: answers %v, want 2 from each of backend-0 and backend-1", h.Name, proto, dst, counts)
		return
	}
	r := askFrom(e.t, h, proto, dst)
	want := backendAddr(2, servicelb.FamilyOf(dst.Addr()))
	if masqueraded {
		want = e.gateway(e.backendIndex(r.Host), dst.Addr())
	}
	if r.Client.Addr() != want {
		e.t.Errorf("%s to %s %s: seen from %s, want %s", h.Name, proto, dst, r.Client.Addr(), want)
	}
}

// TestUnallocatedServiceAddressDropped checks that, with service CIDRs,
// flows to an address in them that no service holds are dropped, not
// routed on (here to a host that holds it), while the cluster IPs keep
// rejecting their unserved ports and serving the others.
func TestUnallocatedServiceAddressDropped(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serve("tcp", 8080, 0)
	e.serve("tcp", 80, 1)
	svc := multiService()
	svc.Ports = svc.Ports[:1]
	svc.Endpoints = endpoints(0)
	unallocated := []netip.AddrPort{ap(a("10.96.0.99"), 80), ap(a("fd00:96::99"), 80)}
	for _, dst := range unallocated {
		e.tp.Backends[1].AddAddress(t, netip.PrefixFrom(dst.Addr(), dst.Addr().BitLen()))
	}
	e.sync(e.state(svc))
	for _, dst := range unallocated {
		if r := askFrom(t, e.tp.Client, "tcp", dst); r.Host != "backend-1" {
			t.Fatalf("without service CIDRs, %s answered by %s, want backend-1 (routed on)", dst, r.Host)
		}
	}
	e.node.ServiceCIDRs = []netip.Prefix{pfx("10.96.0.0/16"), pfx("fd00:96::/112")}
	e.sync(e.state(svc))
	for _, dst := range unallocated {
		wantFailure(t, e.tp.Client, "tcp", dst, netnstest.ErrTimeout)
		wantFailure(t, e.tp.Backends[0], "tcp", dst, netnstest.ErrTimeout)
	}
	for _, cip := range []netip.Addr{a("10.96.0.10"), a("fd00:96::10")} {
		wantFailure(t, e.tp.Client, "tcp", ap(cip, 81), netnstest.ErrRefused)
		wantFailure(t, e.tp.Node, "tcp", ap(cip, 81), netnstest.ErrRefused)
		askFrom(t, e.tp.Client, "tcp", ap(cip, 80))
		askFrom(t, e.tp.Backends[1], "tcp", ap(cip, 80))
	}
}

// TestRejectUnservedPort checks that a virtual address rejects ports no
// service uses, even one the node itself listens on.
func TestRejectUnservedPort(t *testing.T) {
	e := newEnv(t, 1, Options{})
	e.serve("tcp", 8080, 0)
	e.tp.Node.Serve(t, "tcp", 8081)
	svc := multiService()
	svc.Ports = svc.Ports[:1]
	svc.Endpoints = endpoints(0)
	e.sync(e.state(svc))
	askFrom(t, e.tp.Client, "tcp", ap(netnstest.NodeIPv4(), 8081)) // the node's own service
	for _, cip := range []netip.Addr{a("10.96.0.10"), a("fd00:96::10")} {
		wantFailure(t, e.tp.Client, "tcp", ap(cip, 8081), netnstest.ErrRefused)
		askFrom(t, e.tp.Client, "tcp", ap(cip, 80))
	}
}
