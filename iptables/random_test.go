//go:build linux

package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// randomServices makes random but valid services over a small universe, so
// that random sequences of changes hit every shape of service port and
// every transition between shapes: both families and either alone, every
// verdict shape (the traffic policies, with and without local endpoints,
// on nodes with and without cluster CIDRs), source ranges of both
// families (with and without the node inside), affinity, health check
// node ports, weights, node ports, external and load-balancer IPs, and
// scheduler hints, one of them ("rr") refused by the iptables backend.
// Service i mostly uses addresses and ports of its own; now and then it
// asks for a frontend another service may hold (a shared external IP,
// cluster IP or node port, a virtual address on a node address), so
// that servicelb gives it to one of them.
type randomServices struct {
	r *rand.Rand
}

func (g randomServices) pick(n int) int { return g.r.IntN(n) }

func (g randomServices) one(n int) bool { return g.r.IntN(n) == 0 }

func (g randomServices) service(i int) servicelb.Service {
	s := servicelb.Service{Name: fmt.Sprintf("ns%d/svc%d", i%3, i)}
	v4, v6 := g.pick(4) != 0, g.one(3)
	if !v4 && !v6 {
		v4 = true
	}
	g.addresses(&s, i, v4, v6)
	protos := []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	for j := range 1 + g.pick(3) {
		p := servicelb.Port{Name: fmt.Sprintf("p%d", j), Protocol: protos[g.pick(3)], Port: uint16(80 + j)}
		if g.one(2) {
			p.NodePort = uint16(30000 + i*10 + j)
			if j == 0 && g.one(10) {
				p.NodePort = 30999 // shared
			}
		}
		if g.one(2) {
			p.TargetPort = uint16(8080 + j)
		}
		s.Ports = append(s.Ports, p)
	}
	if g.one(6) {
		// Another service's node port, on a node address.
		s.Ports[0].Protocol, s.Ports[0].Port = servicelb.TCP, uint16(30000+g.pick(12)*10)
		s.ExternalIPs = append(s.ExternalIPs, g.nodeIP(v4))
	}
	if g.one(3) {
		s.InternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.one(3) {
		s.ExternalTrafficPolicy = servicelb.PolicyLocal
		if g.one(2) {
			s.HealthCheckNodePort = uint16(32000 + i)
			if g.one(5) {
				s.HealthCheckNodePort = 32700 // shared
			}
		}
	}
	if g.one(4) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Duration(1+g.pick(100)) * time.Second}
	}
	s.Scheduler = []servicelb.Scheduler{"", "", "", servicelb.SchedulerRandom, servicelb.SchedulerRoundRobin}[g.pick(5)]
	for range g.pick(5) {
		s.Endpoints = append(s.Endpoints, g.endpoint(v4, v6))
	}
	return s
}

// addresses gives service i its cluster IPs, external IPs,
// load-balancer IPs and source ranges.
func (g randomServices) addresses(s *servicelb.Service, i int, v4, v6 bool) {
	if v4 && !g.one(8) {
		s.ClusterIPs = append(s.ClusterIPs, netip.AddrFrom4([4]byte{10, 96, byte(i), 1}))
		if g.one(10) {
			s.ClusterIPs[0] = netip.MustParseAddr("10.96.200.1") // shared
		}
	}
	if v6 && !g.one(8) {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", 0x100+i)))
	}
	if g.one(3) {
		if v4 {
			s.ExternalIPs = append(s.ExternalIPs, netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}))
		}
		if v6 {
			s.ExternalIPs = append(s.ExternalIPs, netip.MustParseAddr(fmt.Sprintf("fd00:e::%x", i+1)))
		}
		if g.one(5) {
			s.ExternalIPs = append(s.ExternalIPs, netip.MustParseAddr("192.0.2.200")) // shared
		}
	}
	if g.one(3) {
		if v4 {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)}))
		}
		if v6 {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.MustParseAddr(fmt.Sprintf("fd00:cb::%x", i+1)))
		}
		ranges := prefixes("192.0.2.0/25", "198.51.100.0/24", "fd00:c::/64", "fd00:99::/64", "0.0.0.0/0")
		for range g.pick(4) {
			s.SourceRanges = append(s.SourceRanges, ranges[g.pick(len(ranges))])
		}
	}
}

// nodeIP returns an address of the node: one of richNode's, or the
// second IPv4 address of a node variant.
func (g randomServices) nodeIP(v4 bool) netip.Addr {
	if !v4 {
		return netip.MustParseAddr("fd00:c::1")
	}
	return addrs("198.51.100.1", "198.51.100.9")[g.pick(2)]
}

func (g randomServices) endpoint(v4, v6 bool) servicelb.Endpoint {
	k := byte(1 + g.pick(4))
	e := servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, k, byte(2 + g.pick(3))}),
		Ready: new(!g.one(5)), Serving: new(!g.one(8)), Terminating: g.one(5), NodeName: fmt.Sprintf("node-%c", 'a'+k-1),
		Zone: fmt.Sprintf("z%d", k%2)}
	if v6 && (!v4 || g.one(2)) {
		e.Addr = netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::%d", k, 2+g.pick(3)))
	}
	if g.one(4) {
		e.Weight = servicelb.Weight(uint16(g.pick(4)))
	}
	if g.one(4) {
		e.Hints.ForZones = []string{fmt.Sprintf("z%d", g.pick(2))}
	}
	if g.one(6) {
		e.Hints.ForNodes = []string{fmt.Sprintf("node-%c", 'a'+g.pick(2))}
	}
	if g.one(6) {
		e.Ports = map[string]uint16{"p0": 9000}
	}
	return e
}

// node returns a random variant of the node, for node changes.
func (g randomServices) node() servicelb.NodeConfig {
	n := richNode()
	if g.one(2) {
		n.NodeIPs = append(n.NodeIPs, netip.MustParseAddr("198.51.100.9"))
	}
	switch g.pick(7) {
	case 0:
		n.MasqueradeAll = true
	case 1:
		n.ClusterCIDRs = append(n.ClusterCIDRs, prefixes("10.245.0.0/16", "fd00:245::/48")...)
	case 2:
		n.ServiceCIDRs = nil
	case 3:
		n.ClusterCIDRs = nil
	case 4:
		n.ClusterCIDRs = prefixes("10.244.0.0/16")
	case 5:
		n.NodePortAddresses = prefixes("198.51.100.0/24")
	case 6:
		n.Zone = "z1"
	}
	return n
}
