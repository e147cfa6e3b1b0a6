//go:build vm

package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// multiService is a dual-stack service with a TCP, a UDP and an SCTP port,
// each also a node port, on backends 0-2.
func multiService() servicelb.Service {
	return servicelb.Service{
		Name:       "default/multi",
		ClusterIPs: []netip.Addr{a("10.96.0.10"), a("fd00:96::10")},
		Ports: []servicelb.Port{
			{Name: "tcp", Protocol: tcp, Port: 80, NodePort: 30080, TargetPort: 8080},
			{Name: "udp", Protocol: udp, Port: 53, NodePort: 30053, TargetPort: 5353},
			{Name: "sctp", Protocol: sctp, Port: 90, NodePort: 30090, TargetPort: 9090},
		},
		Endpoints: endpoints(0, 1, 2),
	}
}

// TestTraffic sends real packets through every protocol and family, to the
// cluster IP and to the node port, and checks the round robin spread and
// that the kernel's table is what Render shows.
func TestTraffic(t *testing.T) {
	netnstest.Require(t, "sctp")
	e := newEnv(t, 3, Options{})
	for _, s := range []struct {
		proto string
		port  uint16
	}{{"tcp", 8080}, {"udp", 5353}, {"sctp", 9090}} {
		e.serve(s.proto, s.port, 0, 1, 2)
	}
	st := e.state(multiService())
	e.sync(st)
	e.checkIPVS(st)
	for _, sp := range st.Ports() {
		proto := sp.Port.Protocol.Lower()
		for _, dst := range []netip.AddrPort{ap(sp.ClusterIP, sp.Port.Port), ap(sp.NodeIPs[0], sp.Port.NodePort)} {
			t.Run(fmt.Sprintf("%s/%s", proto, dst), func(t *testing.T) {
				counts := e.tp.Client.Count(t, proto, dst, 9)
				for _, b := range e.tp.Backends {
					if counts[b.Name] != 3 {
						t.Fatalf("answers %v: want 3 from each backend (round robin)", counts)
					}
				}
			})
		}
	}
}

// TestRoundRobinOrder checks that rr hands connections to the backends in
// a fixed cycle.
func TestRoundRobinOrder(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1, 2)
	svc := multiService()
	svc.Ports = svc.Ports[:1]
	e.sync(e.state(svc))
	var seq []string
	for range 9 {
		r, err := e.tp.Client.Ask(t.Context(), "tcp", ap(a("10.96.0.10"), 80))
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, r.Host)
	}
	if seq[0] == seq[1] || seq[1] == seq[2] || seq[0] == seq[2] {
		t.Fatalf("first three answers %v: want three different backends", seq[:3])
	}
	for i := 3; i < len(seq); i++ {
		if seq[i] != seq[i-3] {
			t.Fatalf("answers %v: not a cycle of three", seq)
		}
	}
}

// TestWeights checks that wrr, and the empty hint, spread connections in
// proportion to the endpoint weights, exactly over whole cycles.
func TestWeights(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1, 2)
	for _, sched := range []servicelb.Scheduler{servicelb.SchedulerWeightedRR, servicelb.SchedulerDefault} {
		svc := multiService()
		svc.Ports = svc.Ports[:1]
		svc.Scheduler = sched
		for i := range svc.Endpoints {
			b := i / 2 // two endpoints (families) per backend
			svc.Endpoints[i].Weight = servicelb.Weight(uint16(b + 1))
		}
		st := e.state(svc)
		e.sync(st)
		e.checkIPVS(st)
		counts := e.tp.Client.Count(t, "tcp", ap(a("10.96.0.10"), 80), 60)
		for i, b := range e.tp.Backends {
			if want := 10 * (i + 1); counts[b.Name] != want {
				t.Fatalf("scheduler %q: answers %v: want %d from %s (weight %d)", sched, counts, want, b.Name, i+1)
			}
		}
	}
}

// TestSourceHash checks that sh sends one client address to one backend,
// and different addresses to different backends.
func TestSourceHash(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1, 2)
	svc := multiService()
	svc.Ports = svc.Ports[:1]
	svc.Scheduler = servicelb.SchedulerSourceHash
	e.sync(e.state(svc))
	dst := ap(a("10.96.0.10"), 80)
	if counts := e.tp.Client.Count(t, "tcp", dst, 12); len(counts) != 1 {
		t.Fatalf("answers %v: want one backend for one client address", counts)
	}
	seen := map[string]bool{}
	for i := range 16 {
		src := netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)})
		e.tp.Client.AddAddress(t, netip.PrefixFrom(src, 24))
		first := ""
		for range 3 {
			r, err := e.tp.Client.Ask(t.Context(), "tcp", dst, netnstest.FromAddr(src))
			if err != nil {
				t.Fatal(err)
			}
			if first != "" && r.Host != first {
				t.Fatalf("client %s answered by %s then %s", src, first, r.Host)
			}
			first = r.Host
		}
		seen[first] = true
	}
	if len(seen) < 2 {
		t.Fatalf("16 client addresses all hashed to %v", seen)
	}
}

// TestAffinity checks that ClientIP affinity sticks, and expires. IPVS
// keeps a client's choice (its persistence template) for the affinity
// timeout after the client's last new connection, and while connections it
// chose live on: with IPVS's UDP timeout at 1s and affinity at 3s, a client
// asking again after 1.5s sticks, and one silent for 4.5s gets a fresh
// choice, the next backend in rr order.
func TestAffinity(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1, 2)
	e.serve("udp", 5353, 0, 1, 2)
	svc := multiService()
	svc.Ports = svc.Ports[:2]
	svc.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: 3 * time.Second}
	st := e.state(svc)
	e.sync(st)
	e.checkIPVS(st)
	for _, cip := range []netip.Addr{a("10.96.0.10"), a("fd00:96::10")} {
		if counts := e.tp.Client.Count(t, "tcp", ap(cip, 80), 10); len(counts) != 1 {
			t.Errorf("tcp %s: answers %v: want one backend", cip, counts)
		}
	}
	e.tp.Node.Exec(t, "ipvsadm", "--set", "0", "0", "1")
	dst := ap(a("10.96.0.10"), 53)
	counts := e.tp.Client.Count(t, "udp", dst, 10)
	if len(counts) != 1 {
		t.Fatalf("udp: answers %v: want one backend", counts)
	}
	var first string
	for h := range counts {
		first = h
	}
	time.Sleep(1500 * time.Millisecond)
	if r, err := e.tp.Client.Ask(t.Context(), "udp", dst); err != nil || r.Host != first {
		t.Fatalf("udp ask after 1.5s: %v, %v; want %s still", r, err, first)
	}
	time.Sleep(4500 * time.Millisecond)
	if r, err := e.tp.Client.Ask(t.Context(), "udp", dst); err != nil || r.Host == first {
		t.Fatalf("udp ask after 4.5s of silence: %v, %v; want another backend than %s", r, err, first)
	}
}

// TestNoEndpointsRejected checks that a service without endpoints refuses
// connections at once (IPVS answers ICMP port unreachable).
func TestNoEndpointsRejected(t *testing.T) {
	e := newEnv(t, 1, Options{})
	svc := multiService()
	svc.Ports = svc.Ports[:2]
	svc.Endpoints = nil
	st := e.state(svc)
	e.sync(st)
	e.checkIPVS(st)
	for _, dst := range []struct {
		proto string
		ap    netip.AddrPort
	}{
		{"tcp", ap(a("10.96.0.10"), 80)}, {"udp", ap(a("10.96.0.10"), 53)},
		{"tcp", ap(a("fd00:96::10"), 80)}, {"udp", ap(a("fd00:96::10"), 53)},
		{"tcp", ap(netnstest.NodeIPv4(), 30080)},
	} {
		_, err := e.tp.Client.Ask(t.Context(), dst.proto, dst.ap)
		if !errors.Is(err, netnstest.ErrRefused) {
			t.Errorf("%s %s: %v, want refused", dst.proto, dst.ap, err)
		}
	}
}

// TestMaglevSpreadsOneClient checks that mh hashes the client's port too
// (IPVS's mh-port flag): the connections of one client address spread
// over several endpoints instead of all going to one.
func TestMaglevSpreadsOneClient(t *testing.T) {
	e := newEnv(t, 3, Options{})
	e.serve("tcp", 8080, 0, 1, 2)
	e.serve("udp", 5353, 0, 1, 2)
	svc := multiService()
	svc.Ports = svc.Ports[:2]
	svc.Scheduler = servicelb.SchedulerMaglev
	st := e.state(svc)
	e.sync(st)
	e.checkIPVS(st)
	for _, q := range []struct {
		proto string
		dst   netip.AddrPort
	}{{"tcp", ap(a("10.96.0.10"), 80)}, {"udp", ap(a("fd00:96::10"), 53)}, {"tcp", ap(netnstest.NodeIPv4(), 30080)}} {
		if counts := e.tp.Client.Count(t, q.proto, q.dst, 24); len(counts) < 2 {
			t.Errorf("%s %s: one client's answers %v, want several backends", q.proto, q.dst, counts)
		}
	}
}
