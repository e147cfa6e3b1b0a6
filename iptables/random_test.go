package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// randomServices makes random but valid services over a small universe, so
// that random sequences of changes hit every shape and every transition
// between shapes. Service i always uses its own addresses and node ports,
// so that no two services conflict.
type randomServices struct {
	r *rand.Rand
}

func (g randomServices) pick(n int) int { return g.r.IntN(n) }

func (g randomServices) service(i int) servicelb.Service {
	s := servicelb.Service{Name: fmt.Sprintf("ns%d/svc%d", i%3, i)}
	v4, v6 := g.pick(4) != 0, g.pick(3) == 0
	if !v4 && !v6 {
		v4 = true
	}
	if v4 {
		s.ClusterIPs = append(s.ClusterIPs, netip.AddrFrom4([4]byte{10, 96, byte(i), 1}))
	}
	if v6 {
		s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(fmt.Sprintf("fd00:96::%x:1", i+1)))
	}
	if g.pick(3) == 0 {
		s.ExternalIPs = append(s.ExternalIPs, netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}))
	}
	if g.pick(3) == 0 {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, netip.AddrFrom4([4]byte{203, 0, 113, byte(i + 1)}))
		if g.pick(2) == 0 {
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.0/25")}[:1+g.pick(2)]
		}
	}
	protos := []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	for j := range 1 + g.pick(3) {
		p := servicelb.Port{Name: fmt.Sprintf("p%d", j), Protocol: protos[g.pick(3)], Port: uint16(80 + j)}
		if g.pick(2) == 0 {
			p.NodePort = uint16(30000 + i*10 + j)
		}
		if g.pick(2) == 0 {
			p.TargetPort = uint16(8080 + j)
		}
		s.Ports = append(s.Ports, p)
	}
	if g.pick(3) == 0 {
		s.InternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.pick(3) == 0 {
		s.ExternalTrafficPolicy = servicelb.PolicyLocal
		if g.pick(2) == 0 {
			s.HealthCheckNodePort = uint16(32000 + i)
		}
	}
	if g.pick(4) == 0 {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Duration(1+g.pick(100)) * time.Second}
	}
	for range g.pick(5) {
		s.Endpoints = append(s.Endpoints, g.endpoint(v4, v6))
	}
	return s
}

func (g randomServices) endpoint(v4, v6 bool) servicelb.Endpoint {
	k := byte(1 + g.pick(4))
	e := servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, k, byte(2 + g.pick(3))}),
		Ready: g.pick(5) != 0, Serving: true, Terminating: g.pick(5) == 0, NodeName: fmt.Sprintf("node-%c", 'a'+k-1)}
	if v6 && (!v4 || g.pick(2) == 0) {
		e.Addr = netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::%d", k, 2+g.pick(3)))
	}
	if g.pick(4) == 0 {
		e.Weight = servicelb.Weight(uint16(g.pick(4)))
	}
	return e
}

// node returns a random variant of the node, for node changes.
func (g randomServices) node() servicelb.NodeConfig {
	n := richNode()
	switch g.pick(4) {
	case 0:
		n.MasqueradeAll = true
	case 1:
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("10.245.0.0/16"))
	case 2:
		n.ServiceCIDRs = nil
	}
	return n
}
