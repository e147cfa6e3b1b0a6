//go:build linux

package ipvs

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/internal/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// gen makes random nodes, services and changes for the planner's random
// tests. Addresses come from small pools, so that services share
// endpoints, frontends clash and changes put back what earlier ones took.
type gen struct {
	r *rand.Rand
	// svcs are the services of the Builder the changes go to.
	svcs map[string]servicelb.Service
}

func newGen(seed uint64) *gen { return genFrom(rand.NewPCG(seed, 7)) }

// genFrom returns a gen that draws from src.
func genFrom(src rand.Source) *gen {
	return &gen{r: rand.New(src), svcs: map[string]servicelb.Service{}}
}

func (g *gen) chance(p float64) bool { return g.r.Float64() < p }

func (g *gen) pick(n int) int { return g.r.IntN(n) }

func v4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }

func v6(group uint16, last byte) netip.Addr {
	var b [16]byte
	b[0], b[1], b[2], b[3], b[15] = 0xfd, 0x00, byte(group>>8), byte(group), last
	return netip.AddrFrom16(b)
}

// node returns a random node: addresses of one or both families, cluster
// CIDRs of none, one or both, now and then another local-traffic
// detection, service CIDRs, masquerade-all, node port addresses and
// another masquerade bit.
func (g *gen) node() servicelb.NodeConfig {
	n := servicelb.NodeConfig{NodeName: "node", Zone: "z1", NodeIPs: []netip.Addr{v4(198, 51, 100, 1)}}
	if g.chance(0.3) {
		n.NodeIPs = append(n.NodeIPs, v4(192, 0, 2, 1))
	}
	if g.chance(0.7) {
		n.NodeIPs = append(n.NodeIPs, v6(0xc, 1))
	}
	if g.chance(0.8) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("10.244.0.0/16"))
	}
	if g.chance(0.6) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("fd00:244::/32"))
	}
	if g.chance(0.3) {
		n.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	}
	if g.chance(0.2) {
		n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("fd00:c::/64")}
	}
	n.DetectLocal = servicetest.DetectLocal(g.r)
	n.MasqueradeAll = g.chance(0.15)
	if g.chance(0.1) {
		n.MasqueradeBit = 13
	}
	return n
}

// service returns a random service; now and then one the proxier refuses
// (the random scheduler).
func (g *gen) service(name string) servicelb.Service {
	s := servicelb.Service{Name: name}
	i := byte(g.pick(6))
	if g.chance(0.8) {
		s.ClusterIPs = append(s.ClusterIPs, v4(10, 96, 0, 10+i))
	}
	if g.chance(0.5) {
		s.ClusterIPs = append(s.ClusterIPs, v6(0x96, 10+i))
	}
	if g.chance(0.3) {
		s.ExternalIPs = append(s.ExternalIPs, []netip.Addr{v4(203, 0, 113, byte(10+g.pick(3))), v4(198, 51, 100, 1)}[g.pick(2)])
	}
	if g.chance(0.2) {
		s.ExternalIPs = append(s.ExternalIPs, v6(0xe, byte(10+g.pick(3))))
	}
	if g.chance(0.35) {
		s.LoadBalancerIPs = []netip.Addr{v4(203, 0, 114, 10+i)}
		if g.chance(0.5) {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, v6(0xb, 10+i))
		}
		s.SourceRanges = g.ranges()
	}
	g.ports(&s)
	g.policies(&s)
	s.Endpoints = g.endpoints(&s)
	return s
}

// ranges returns random source ranges of both families, some holding a
// node address, one holding every address.
func (g *gen) ranges() []netip.Prefix {
	pool := []string{"198.51.100.0/24", "192.0.2.0/24", "0.0.0.0/0", "2001:db8::/32", "fd00:c::/64", "203.0.113.0/25"}
	var out []netip.Prefix
	for _, p := range pool {
		if g.chance(0.25) {
			out = append(out, netip.MustParsePrefix(p))
		}
	}
	return out
}

func (g *gen) ports(s *servicelb.Service) {
	protos := []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	for j := range 1 + g.pick(3) {
		p := servicelb.Port{Name: fmt.Sprintf("p%d", j), Protocol: protos[g.pick(3)], Port: uint16(80 + j)}
		if g.chance(0.5) {
			p.TargetPort = uint16(8080 + g.pick(2))
		}
		if g.chance(0.4) {
			p.NodePort = uint16(30000 + g.pick(12))
		}
		s.Ports = append(s.Ports, p)
	}
	if g.chance(0.2) {
		s.HealthCheckNodePort = uint16(30900 + g.pick(4))
	}
}

func (g *gen) policies(s *servicelb.Service) {
	s.InternalTrafficPolicy, s.ExternalTrafficPolicy = "", ""
	if g.chance(0.3) {
		s.InternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.chance(0.5) {
		s.ExternalTrafficPolicy = servicelb.PolicyLocal
	}
	s.Affinity = servicelb.SessionAffinity{}
	if g.chance(0.25) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Duration(1+g.pick(600)) * time.Second}
	}
	s.Scheduler = ""
	if g.chance(0.4) {
		scheds := servicelb.Schedulers()
		s.Scheduler = scheds[g.pick(len(scheds))]
		if s.Scheduler == servicelb.SchedulerRandom && g.chance(0.7) {
			s.Scheduler = servicelb.SchedulerMaglev
		}
	}
}

// endpoints returns random endpoints of both families, local or not, in
// every condition, with weights, hints and named ports.
func (g *gen) endpoints(s *servicelb.Service) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for range g.pick(7) {
		h := byte(1 + g.pick(6))
		e := servicelb.Endpoint{Addr: v4(10, 244, h, 2), Ready: new(g.chance(0.75))}
		if g.chance(0.4) {
			e.Addr = v6(0x244, h)
		}
		e.Serving = new(e.IsReady() || g.chance(0.5))
		e.Terminating = !e.IsReady() && g.chance(0.6)
		e.NodeName = []string{"node", "node", "other"}[g.pick(3)]
		e.Zone = []string{"z1", "z2"}[g.pick(2)]
		if g.chance(0.3) {
			e.Hints.ForZones = []string{[]string{"z1", "z2"}[g.pick(2)]}
		}
		if g.chance(0.2) {
			e.Hints.ForNodes = []string{[]string{"node", "other"}[g.pick(2)]}
		}
		if g.chance(0.25) {
			e.Weight = servicelb.Weight(uint16(g.pick(4)))
		}
		if g.chance(0.2) {
			e.Ports = map[string]uint16{s.Ports[g.pick(len(s.Ports))].Name: uint16(9000 + g.pick(3))}
			e.OnlyNamedPorts = g.chance(0.5)
		}
		out = append(out, e)
	}
	return out
}

// change makes one random change to b; changes validation refuses are
// dropped.
func (g *gen) change(b *servicelb.Builder, services int) {
	name := fmt.Sprintf("ns/s%d", g.pick(services))
	upsert := func(s servicelb.Service) {
		if b.Upsert(s) == nil {
			g.svcs[name] = s
		}
	}
	old, ok := g.svcs[name]
	switch x := g.r.Float64(); {
	case x < 0.05:
		_ = b.SetNode(g.node())
	case x < 0.25:
		b.Delete(name)
		delete(g.svcs, name)
	case x < 0.6 && ok:
		upsert(g.tweak(old))
	default:
		upsert(g.service(name))
	}
}

// tweak changes one thing of a service.
func (g *gen) tweak(s servicelb.Service) servicelb.Service {
	switch g.pick(6) {
	case 0:
		s.Endpoints = g.endpoints(&s)
	case 1:
		g.policies(&s)
	case 2:
		s.Ports = nil
		g.ports(&s)
		s.Endpoints = g.endpoints(&s)
	case 3:
		s.SourceRanges = g.ranges()
	case 4:
		s.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
		if len(s.LoadBalancerIPs) > 0 {
			s.LoadBalancerIPs = s.LoadBalancerIPs[:len(s.LoadBalancerIPs)-1]
		} else {
			s.LoadBalancerIPs = []netip.Addr{v4(203, 0, 114, byte(10+g.pick(6)))}
		}
	default:
		if len(s.Endpoints) > 0 {
			eps := slices.Clone(s.Endpoints)
			e := &eps[g.pick(len(eps))]
			e.Ready, e.Weight = new(!e.IsReady()), servicelb.Weight(uint16(g.pick(3)))
			if g.chance(0.5) {
				e.NodeName = []string{"node", "other"}[g.pick(2)]
			}
			s.Endpoints = eps
		}
	}
	return s
}
