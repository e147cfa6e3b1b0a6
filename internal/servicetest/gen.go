// Package servicetest makes random servicelb states for the backends'
// property tests: walks of states, each a random change of the last, that
// vary every field a ServicePort carries, so that "incremental equals
// fresh" tests of every planner draw from one corpus.
package servicetest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Options shape a Gen.
type Options struct {
	// Seed seeds the generator.
	Seed uint64
	// Source, when set, is drawn from instead (see Source, for fuzzing).
	Source rand.Source
	// Services bounds the number of services of a state; default 8.
	Services int
	// Schedulers are the hints services may carry besides the default;
	// nil means none.
	Schedulers []servicelb.Scheduler
	// Protocols are the protocols ports may have; nil means TCP, UDP and
	// SCTP.
	Protocols []servicelb.Protocol
	// MaxEndpoints bounds the endpoints of a service; default 6.
	MaxEndpoints int
}

// Gen makes random nodes, services and changes. Addresses come from small
// pools, so that services share endpoints, external IPs clash, and
// changes often put back what an earlier one took away.
type Gen struct {
	rng *rand.Rand
	o   Options
}

// New returns a Gen.
func New(o Options) *Gen {
	if o.Services == 0 {
		o.Services = 8
	}
	if o.Protocols == nil {
		o.Protocols = []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	}
	if o.MaxEndpoints == 0 {
		o.MaxEndpoints = 6
	}
	src := o.Source
	if src == nil {
		src = rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)
	}
	return &Gen{rng: rand.New(src), o: o}
}

func (g *Gen) chance(p float64) bool { return g.rng.Float64() < p }

func (g *Gen) pick(n int) int { return g.rng.IntN(n) }

func v4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }

func v6(prefix uint16, last byte) netip.Addr {
	var b [16]byte
	b[0], b[1], b[2], b[3], b[15] = 0xfd, 0x00, byte(prefix>>8), byte(prefix), last
	return netip.AddrFrom16(b)
}

// Node returns a random node: named, in a zone or not, with node IPs of
// one or both families, cluster CIDRs of none, one or both, now and then
// another local-traffic detection (node CIDRs of one or both families, a
// bridge, an interface name prefix), service CIDRs and masquerade-all.
func (g *Gen) Node() servicelb.NodeConfig {
	n := servicelb.NodeConfig{NodeName: "n1", NodeIPs: []netip.Addr{v4(192, 0, 2, 1)}}
	if g.chance(0.2) {
		n.NodeName = ""
	}
	if g.chance(0.5) {
		n.Zone = "z1"
	}
	if g.chance(0.6) {
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
	n.DetectLocal = DetectLocal(g.rng)
	n.MasqueradeAll = g.chance(0.15)
	return n
}

// DetectLocal returns a random local-traffic detection: the default (by
// cluster CIDRs) most of the time, else node CIDRs of one or both
// families, a bridge or an interface name prefix, each of two.
func DetectLocal(r *rand.Rand) servicelb.DetectLocal {
	switch r.IntN(8) {
	case 0:
		d := servicelb.DetectLocal{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
		if r.IntN(2) == 0 {
			d.NodeCIDRs = append(d.NodeCIDRs, netip.MustParsePrefix("fd00:244:1::/64"))
		}
		return d
	case 1:
		return servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: []string{"cbr0", "cni0"}[r.IntN(2)]}
	case 2:
		return servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: []string{"veth", "cali"}[r.IntN(2)]}
	}
	return servicelb.DetectLocal{}
}

// Service returns a random valid service named name.
func (g *Gen) Service(name string) servicelb.Service {
	s := servicelb.Service{Name: name}
	i := byte(g.pick(6))
	if g.chance(0.85) {
		s.ClusterIPs = append(s.ClusterIPs, v4(10, 96, 0, 10+i))
	}
	if g.chance(0.5) {
		s.ClusterIPs = append(s.ClusterIPs, v6(0x96, 10+i))
	}
	if g.chance(0.3) {
		s.ExternalIPs = append(s.ExternalIPs, v4(198, 51, 100, byte(10+g.pick(3))))
	}
	if g.chance(0.2) {
		s.ExternalIPs = append(s.ExternalIPs, v6(0xe, byte(10+g.pick(3))))
	}
	if g.chance(0.3) {
		s.LoadBalancerIPs = []netip.Addr{v4(203, 0, 113, 10+i)}
		if g.chance(0.5) {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, v6(0xb, 10+i))
		}
		s.SourceRanges = g.ranges()
		if g.chance(0.4) {
			s.HealthCheckNodePort = uint16(30900 + g.pick(4))
		}
	}
	g.ports(&s)
	g.policies(&s)
	s.Endpoints = g.endpoints(&s)
	return s
}

// ranges returns random source ranges, of either family, one of them
// holding the node's IPv4 address now and then.
func (g *Gen) ranges() []netip.Prefix {
	pool := []string{"198.51.100.0/24", "192.0.2.0/24", "0.0.0.0/0", "2001:db8::/32", "fd00:c::/64", "203.0.113.0/25"}
	var out []netip.Prefix
	for _, p := range pool {
		if g.chance(0.2) {
			out = append(out, netip.MustParsePrefix(p))
		}
	}
	return out
}

func (g *Gen) ports(s *servicelb.Service) {
	n := 1 + g.pick(3)
	for j := range n {
		p := servicelb.Port{
			Name:     fmt.Sprintf("p%d", j),
			Protocol: g.o.Protocols[g.pick(len(g.o.Protocols))],
			Port:     uint16(80 + j),
		}
		if g.chance(0.5) {
			p.TargetPort = uint16(8080 + g.pick(2))
		}
		if g.chance(0.4) {
			p.NodePort = uint16(30000 + g.pick(12))
		}
		s.Ports = append(s.Ports, p)
	}
}

func (g *Gen) policies(s *servicelb.Service) {
	if g.chance(0.3) {
		s.InternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.chance(0.4) {
		s.ExternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.chance(0.25) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true}
		if g.chance(0.5) {
			s.Affinity.Timeout = time.Duration(1+g.pick(600)) * time.Second
		}
	}
	if len(g.o.Schedulers) > 0 && g.chance(0.3) {
		s.Scheduler = g.o.Schedulers[g.pick(len(g.o.Schedulers))]
	}
}

// endpoints returns random endpoints of both families, local or not, in
// every condition, with weights, hints and named ports.
func (g *Gen) endpoints(s *servicelb.Service) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for range g.pick(g.o.MaxEndpoints + 1) {
		h := byte(1 + g.pick(8))
		e := servicelb.Endpoint{Addr: v4(10, 244, h, 2), Ready: new(g.chance(0.75))}
		if g.chance(0.35) {
			e.Addr = v6(0x244, h)
		}
		e.Serving = new(e.IsReady() || g.chance(0.5))
		e.Terminating = !e.IsReady() && g.chance(0.6)
		e.NodeName = []string{"n1", "n2", "n3"}[g.pick(3)]
		e.Zone = []string{"z1", "z2"}[g.pick(2)]
		if g.chance(0.3) {
			e.Hints.ForZones = []string{[]string{"z1", "z2"}[g.pick(2)]}
		}
		if g.chance(0.2) {
			e.Hints.ForNodes = []string{[]string{"n1", "n2"}[g.pick(2)]}
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

// Walk returns n states, each one random change away from the last, all
// from one Builder as a Runner makes them: services upserted, changed in
// one field, deleted, and now and then the node changed. The first state
// is empty.
func (g *Gen) Walk(n int) ([]*servicelb.State, error) {
	b, err := servicelb.NewBuilder(g.Node())
	if err != nil {
		return nil, err
	}
	out := []*servicelb.State{b.State()}
	for len(out) < n {
		g.step(b)
		if st := b.State(); st != out[len(out)-1] {
			out = append(out, st)
		}
	}
	return out, nil
}

// step makes one random change; changes validation refuses are dropped.
func (g *Gen) step(b *servicelb.Builder) {
	name := fmt.Sprintf("ns/s%d", g.pick(g.o.Services))
	switch r := g.rng.Float64(); {
	case r < 0.05:
		_ = b.SetNode(g.Node())
	case r < 0.25:
		b.Delete(name)
	case r < 0.55 && b.Has(name):
		s, _ := b.State().Service(name)
		_ = b.Upsert(g.tweak(*s))
	default:
		_ = b.Upsert(g.Service(name))
	}
}

// tweak changes one thing of a service: its endpoints, a policy, a port.
func (g *Gen) tweak(s servicelb.Service) servicelb.Service {
	switch g.pick(5) {
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
	default:
		if len(s.Endpoints) > 0 {
			eps := append([]servicelb.Endpoint(nil), s.Endpoints...)
			e := &eps[g.pick(len(eps))]
			e.Ready, e.Weight = new(!e.IsReady()), servicelb.Weight(uint16(g.pick(3)))
			s.Endpoints = eps
		}
	}
	return s
}
