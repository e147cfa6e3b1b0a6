// Package servicetest makes random servicelb states for the backends'
// property tests: walks of states, each a random change of the last, that
// vary every field a ServicePort carries, so that the "incremental equals
// fresh" tests of every planner (nftables, iptables, ipvs, ebpf) and the
// fuzzing of servicelb's Diff draw from one corpus.
package servicetest

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Options shape a Gen.
type Options struct {
	// Seed seeds the generator.
	Seed uint64
	// Source, when set, is drawn from instead (see Source, for fuzzing).
	Source rand.Source
	// Services is the number of service names the changes pick from
	// (Name); default 8.
	Services int
	// Schedulers are the hints services may carry besides the default;
	// nil means none.
	Schedulers []servicelb.Scheduler
	// Protocols are the protocols ports may have; nil means TCP, UDP and
	// SCTP.
	Protocols []servicelb.Protocol
	// MaxEndpoints bounds the endpoints of a service; default 6.
	MaxEndpoints int
	// LocalhostNodePorts lets nodes serve node ports on 127.0.0.1, which
	// only a backend with servicelb.FeatureLocalhostNodePorts expresses.
	LocalhostNodePorts bool
}

// Gen makes random nodes, services and changes. Addresses come from small
// pools, so that services share endpoints, frontends clash (two services
// on one external IP, cluster IP or node port, a virtual address on a node
// address at another service's node port), and changes often put back
// what an earlier one took away. Every node and service it makes is valid.
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

// IntN returns a random number in [0, n) from the generator's source, for
// a test's own choices (so that a fuzzer's data steers them too).
func (g *Gen) IntN(n int) int { return g.rng.IntN(n) }

// Name returns the name of service i: "ns<i%3>/s<i>".
func (g *Gen) Name(i int) string { return fmt.Sprintf("ns%d/s%d", i%3, i) }

// Services returns the number of service names (Options.Services).
func (g *Gen) Services() int { return g.o.Services }

func (g *Gen) chance(p float64) bool { return g.rng.Float64() < p }

func (g *Gen) pick(n int) int { return g.rng.IntN(n) }

func oneOf[T any](g *Gen, xs ...T) T { return xs[g.pick(len(xs))] }

func v4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }

func v6(prefix uint16, last byte) netip.Addr {
	var b [16]byte
	b[0], b[1], b[2], b[3], b[15] = 0xfd, 0x00, byte(prefix>>8), byte(prefix), last
	return netip.AddrFrom16(b)
}

// The node's addresses: its primary ones (NodeIPs), a second IPv4 one,
// and other local addresses (LocalIPs).
var (
	NodeIPv4       = v4(198, 51, 100, 1)
	NodeIPv6       = v6(0xc, 1)
	nodeIPv4Second = v4(192, 0, 2, 1)
	localIPs       = []netip.Addr{v4(198, 51, 100, 9), v4(172, 18, 0, 1), v6(0xc, 9)}
)

// Node returns a random node: named or not (endpoints on "n1" are local),
// in a zone or not; node IPs of one or both families, other local
// addresses, node port addresses that select some of them, the primary
// keyword, node ports on localhost (Options.LocalhostNodePorts); cluster
// CIDRs of none, one or both families (some inside others), now and then
// another local-traffic detection (node CIDRs of one or both families, a
// bridge, an interface name prefix); service CIDRs (some inside others);
// masquerade-all and another masquerade bit.
func (g *Gen) Node() servicelb.NodeConfig {
	n := servicelb.NodeConfig{NodeName: "n1", NodeIPs: []netip.Addr{NodeIPv4}}
	if g.chance(0.15) {
		n.NodeName = ""
	}
	if g.chance(0.5) {
		n.Zone = "z1"
	}
	if g.chance(0.3) {
		n.NodeIPs = append(n.NodeIPs, nodeIPv4Second)
	}
	if g.chance(0.6) {
		n.NodeIPs = append(n.NodeIPs, NodeIPv6)
	}
	g.nodePorts(&n)
	if g.chance(0.8) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("10.244.0.0/16"))
		if g.chance(0.15) {
			n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix(oneOf(g, "10.244.1.0/24", "10.245.0.0/16")))
		}
	}
	if g.chance(0.6) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("fd00:244::/32"))
	}
	if g.chance(0.4) {
		n.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
		if g.chance(0.5) {
			n.ServiceCIDRs = append(n.ServiceCIDRs, netip.MustParsePrefix(oneOf(g, "10.96.0.0/24", "fd00:96::/120", "10.97.0.0/16")))
		}
	}
	n.DetectLocal = DetectLocal(g.rng)
	n.MasqueradeAll = g.chance(0.15)
	if g.chance(0.15) {
		n.MasqueradeBit = oneOf[uint8](g, 5, 12, 13)
	}
	return n
}

// nodePorts chooses where the node serves node ports: every local
// address, some selected by prefixes, the primary ones, localhost.
func (g *Gen) nodePorts(n *servicelb.NodeConfig) {
	for _, a := range localIPs {
		if g.chance(0.35) {
			n.LocalIPs = append(n.LocalIPs, a)
		}
	}
	switch g.pick(8) {
	case 0:
		n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	case 1:
		n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("fd00:c::/64")}
	case 2:
		n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("172.18.0.0/16")}
	case 3:
		n.NodePortPrimary = true // alone: kube-proxy refuses it beside CIDRs
	}
	n.LocalhostNodePorts = g.o.LocalhostNodePorts && g.chance(0.2)
}

// DetectLocal returns a random local-traffic detection: the default (by
// cluster CIDRs) half the time, else node CIDRs of one or both families,
// a bridge or an interface name prefix, each of two.
func DetectLocal(r *rand.Rand) servicelb.DetectLocal {
	switch r.IntN(6) {
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

// Service returns a random valid version of service i (named Name(i)).
// Its cluster IPs and some of its other addresses are its own; some are
// shared with other services.
func (g *Gen) Service(i int) servicelb.Service {
	s := servicelb.Service{Name: g.Name(i)}
	if g.chance(0.85) {
		s.ClusterIPs = append(s.ClusterIPs, v4(10, 96, byte(i/200), byte(10+i%200)))
		if g.chance(0.05) {
			s.ClusterIPs[0] = v4(10, 96, 250, 1) // shared
		}
	}
	if g.chance(0.5) {
		s.ClusterIPs = append(s.ClusterIPs, v6(0x96, byte(10+i)))
	}
	g.frontends(&s, i)
	g.ports(&s)
	if g.chance(0.08) {
		// A virtual address on a node address, at a node port another
		// service may have.
		s.Ports[0].Protocol, s.Ports[0].Port = servicelb.TCP, nodePort(g.pick(12), 0)
		s.ExternalIPs = appendNew(s.ExternalIPs, oneOf(g, NodeIPv4, nodeIPv4Second))
	}
	g.policies(&s)
	if (s.ExternalTrafficPolicy == servicelb.PolicyLocal || len(s.LoadBalancerIPs) > 0) && g.chance(0.4) {
		s.HealthCheckNodePort = uint16(30900 + g.pick(4))
	}
	s.Endpoints = g.endpoints(&s, i)
	return s
}

// appendNew appends a unless as holds it.
func appendNew(as []netip.Addr, a netip.Addr) []netip.Addr {
	if slices.Contains(as, a) {
		return as
	}
	return append(as, a)
}

// frontends gives service i external IPs (shared, its own, a node
// address), load-balancer IPs (in Proxy mode now and then) and source
// ranges.
func (g *Gen) frontends(s *servicelb.Service, i int) {
	if g.chance(0.3) {
		s.ExternalIPs = appendNew(s.ExternalIPs, oneOf(g, v4(198, 51, 100, byte(10+g.pick(3))), v4(203, 0, 114, byte(100+i%100)), NodeIPv4))
	}
	if g.chance(0.2) {
		s.ExternalIPs = appendNew(s.ExternalIPs, oneOf(g, v6(0xe, byte(10+g.pick(3))), NodeIPv6))
	}
	if g.chance(0.35) {
		s.LoadBalancerIPs = []netip.Addr{v4(203, 0, 113, byte(10+i%200))}
		if g.chance(0.05) {
			s.LoadBalancerIPs[0] = v4(203, 0, 113, 250) // shared
		}
		if g.chance(0.5) {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, v6(0xb, byte(10+i)))
		}
		s.SourceRanges = g.ranges()
	}
	if g.chance(0.15) {
		s.ProxiedLoadBalancerIPs = []netip.Addr{v4(203, 0, 112, byte(10+i%200))}
	}
}

// ranges returns random source ranges of either family: one holding the
// node's addresses, one holding every address, one inside another, one
// holding the load-balancer IPs.
func (g *Gen) ranges() []netip.Prefix {
	pool := []string{"198.51.100.0/24", "198.51.100.0/28", "192.0.2.0/25", "0.0.0.0/0", "2001:db8::/32", "fd00:c::/64", "203.0.113.0/25"}
	var out []netip.Prefix
	for _, p := range pool {
		if g.chance(0.2) {
			out = append(out, netip.MustParsePrefix(p))
		}
	}
	return out
}

// nodePort returns the j-th node port of slot k: services that draw one
// slot share its node ports.
func nodePort(k, j int) uint16 { return uint16(30000 + 3*k + j) }

func (g *Gen) ports(s *servicelb.Service) {
	k := g.pick(12)
	for j := range 1 + g.pick(3) {
		p := servicelb.Port{
			Name:     fmt.Sprintf("p%d", j),
			Protocol: g.o.Protocols[g.pick(len(g.o.Protocols))],
			Port:     uint16(80 + j),
		}
		if g.chance(0.5) {
			p.TargetPort = uint16(8080 + g.pick(2))
		}
		if g.chance(0.4) {
			p.NodePort = nodePort(k, j)
		}
		s.Ports = append(s.Ports, p)
	}
}

func (g *Gen) policies(s *servicelb.Service) {
	s.InternalTrafficPolicy, s.ExternalTrafficPolicy = "", ""
	if g.chance(0.3) {
		s.InternalTrafficPolicy = servicelb.PolicyLocal
	}
	if g.chance(0.4) {
		s.ExternalTrafficPolicy = servicelb.PolicyLocal
	}
	s.Affinity = servicelb.SessionAffinity{}
	if g.chance(0.25) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true}
		if g.chance(0.5) {
			s.Affinity.Timeout = time.Duration(1+g.pick(600)) * time.Second
		}
	}
	s.Scheduler = ""
	if len(g.o.Schedulers) > 0 && g.chance(0.3) {
		s.Scheduler = g.o.Schedulers[g.pick(len(g.o.Schedulers))]
	}
}

// endpoints returns random endpoints of service i: of both families, on
// shared addresses and on its own, local or not, in every condition, with
// weights, hints, named ports, and now and then an address and port
// listed twice.
func (g *Gen) endpoints(s *servicelb.Service, i int) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for range g.pick(g.o.MaxEndpoints + 1) {
		if len(out) > 0 && g.chance(0.08) {
			e := out[g.pick(len(out))]
			e.NodeName, e.Ready = oneOf(g, "n1", "n2"), new(g.chance(0.5))
			out = append(out, e)
			continue
		}
		h := byte(1 + g.pick(8))
		e := servicelb.Endpoint{Addr: v4(10, 244, h, 2), Ready: new(g.chance(0.75))}
		switch g.pick(10) {
		case 0, 1, 2:
			e.Addr = v6(0x244, h)
		case 3:
			e.Addr = v4(10, 245, byte(i), byte(1+g.pick(250)))
		}
		e.Serving = new(e.IsReady() || g.chance(0.5))
		e.Terminating = !e.IsReady() && g.chance(0.6)
		e.NodeName = oneOf(g, "n1", "n2", "n3", "")
		e.Zone = oneOf(g, "z1", "z2", "")
		if g.chance(0.3) {
			e.Hints.ForZones = []string{oneOf(g, "z1", "z2")}
			if g.chance(0.2) {
				e.Hints.ForZones = []string{"z1", "z2"}
			}
		}
		if g.chance(0.2) {
			e.Hints.ForNodes = []string{oneOf(g, "n1", "n2")}
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

// Start returns a Builder on a random node with the first half of the
// services.
func (g *Gen) Start() (*servicelb.Builder, error) {
	b, err := servicelb.NewBuilder(g.Node())
	if err != nil {
		return nil, err
	}
	for i := range g.o.Services / 2 {
		if err := b.Upsert(g.Service(i)); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// Walk returns n states, each one random change away from the last, all
// from one Builder as a Runner makes them (see Step). The first state is
// empty; changes the Builder refuses are left out.
func (g *Gen) Walk(n int) ([]*servicelb.State, error) {
	b, err := servicelb.NewBuilder(g.Node())
	if err != nil {
		return nil, err
	}
	out := []*servicelb.State{b.State()}
	for len(out) < n {
		g.Step(b)
		if st := b.State(); st != out[len(out)-1] {
			out = append(out, st)
		}
	}
	return out, nil
}

// The kinds of change Step makes.
const (
	ChangeNode      = "node"
	ChangeDelete    = "delete"
	ChangeEndpoints = "endpoints"
	ChangeTweak     = "tweak"
	ChangeUpsert    = "upsert"
)

// Step makes one random change to b: now and then a new node, else a
// service deleted, its endpoints changed (some kept, some added), one
// thing of it changed, or a new version of it. It returns the kind of
// change and the Builder's error: only a Builder that requires
// capabilities (Builder.Require) refuses one of its changes, with
// servicelb.ErrUnsupported or ErrCapacity.
func (g *Gen) Step(b *servicelb.Builder) (string, error) {
	i := g.pick(g.o.Services)
	name := g.Name(i)
	old, ok := b.State().Service(name)
	switch r := g.rng.Float64(); {
	case r < 0.06:
		return ChangeNode, b.SetNode(g.Node())
	case r < 0.25:
		b.Delete(name)
		return ChangeDelete, nil
	case r < 0.45 && ok:
		s := *old
		eps := s.Endpoints
		if len(eps) > 0 && g.chance(0.5) {
			eps = eps[1:]
		}
		s.Endpoints = append(slices.Clone(eps), g.endpoints(&s, i)...)
		return ChangeEndpoints, b.Upsert(s)
	case r < 0.65 && ok:
		return ChangeTweak, b.Upsert(g.tweak(*old, i))
	}
	return ChangeUpsert, b.Upsert(g.Service(i))
}

// tweak changes one thing of service i: its endpoints, its policies, its
// ports, its source ranges, its load-balancer IPs, one endpoint's
// conditions, weight or node.
func (g *Gen) tweak(s servicelb.Service, i int) servicelb.Service {
	switch g.pick(6) {
	case 0:
		s.Endpoints = g.endpoints(&s, i)
	case 1:
		g.policies(&s)
	case 2:
		s.Ports = nil
		g.ports(&s)
		s.Endpoints = g.endpoints(&s, i)
	case 3:
		s.SourceRanges = g.ranges()
	case 4:
		if len(s.LoadBalancerIPs) > 0 {
			s.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs[:len(s.LoadBalancerIPs)-1])
		} else {
			s.LoadBalancerIPs = []netip.Addr{v4(203, 0, 113, byte(10+i%200))}
		}
	default:
		if len(s.Endpoints) > 0 {
			eps := slices.Clone(s.Endpoints)
			e := &eps[g.pick(len(eps))]
			e.Ready, e.Weight = new(!e.IsReady()), servicelb.Weight(uint16(g.pick(3)))
			if g.chance(0.5) {
				e.NodeName = oneOf(g, "n1", "n2")
			}
			s.Endpoints = eps
		}
	}
	return s
}
