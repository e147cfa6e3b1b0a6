//go:build linux

package nftables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/internal/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// randomWorld makes random services, endpoints and nodes for the random
// tests, varying every field a ServicePort is compiled from: families,
// policies, local and remote endpoints and the node's cluster CIDRs (which
// shape the verdicts), external and load-balancer IPs (some shared between
// services, some the node's own), node ports (some shared), source ranges
// of both families (some holding a node address), affinity, health check
// node ports, schedulers, weights, topology hints and endpoint conditions.
// Service i owns its cluster IPs; endpoint addresses come from a small
// pool, so that services share them.
type randomWorld struct {
	r    *rand.Rand
	pool int
	// svcs are the services last upserted, by name.
	svcs map[string]servicelb.Service
}

func newRandomWorld(seed uint64, pool int) *randomWorld {
	return worldFrom(rand.NewPCG(seed, 1), pool)
}

// worldFrom returns a world that draws from src.
func worldFrom(src rand.Source, pool int) *randomWorld {
	return &randomWorld{r: rand.New(src), pool: pool, svcs: map[string]servicelb.Service{}}
}

func addr4(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }

func addr6(prefix uint16, i byte) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0, byte(prefix >> 8), byte(prefix), 15: i})
}

// The node's addresses in every random world.
var (
	worldNode4 = addr4(198, 51, 100, 1)
	worldNode6 = addr6(0xc, 1)
)

func (w *randomWorld) pick(n int) int { return w.r.IntN(n) }

func (w *randomWorld) chance(p float64) bool { return w.r.Float64() < p }

func (w *randomWorld) name(i int) string { return fmt.Sprintf("ns%d/svc-%d", i%3, i) }

// service returns a random version of service i.
func (w *randomWorld) service(i int) servicelb.Service {
	s := servicelb.Service{Name: w.name(i)}
	v4, v6 := !w.chance(0.2), w.chance(0.5)
	if w.chance(0.9) {
		if v4 {
			s.ClusterIPs = append(s.ClusterIPs, addr4(10, 96, 0, byte(i)))
		}
		if v6 {
			s.ClusterIPs = append(s.ClusterIPs, addr6(0x96, byte(i)))
		}
	}
	w.frontends(&s, i, v6)
	w.ports(&s, i)
	for _, pol := range []*servicelb.TrafficPolicy{&s.InternalTrafficPolicy, &s.ExternalTrafficPolicy} {
		if w.chance(0.35) {
			*pol = servicelb.PolicyLocal
		}
	}
	if w.chance(0.25) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Duration(1+w.pick(100)) * time.Second}
	}
	if w.chance(0.3) {
		s.HealthCheckNodePort = uint16(31000 + i%20)
	}
	if w.chance(0.3) {
		s.Scheduler = servicelb.SchedulerRandom
	}
	s.Endpoints = w.endpoints(i)
	return s
}

// frontends adds external and load-balancer IPs and source ranges. Some
// external IPs are shared between services, or are the node's address,
// so that servicelb gives the frontend to one of them.
func (w *randomWorld) frontends(s *servicelb.Service, i int, v6 bool) {
	if w.chance(0.3) {
		switch w.pick(4) {
		case 0:
			s.ExternalIPs = append(s.ExternalIPs, worldNode4)
		case 1:
			s.ExternalIPs = append(s.ExternalIPs, addr4(203, 0, 114, byte(i%8)))
		default:
			s.ExternalIPs = append(s.ExternalIPs, addr4(203, 0, 114, byte(100+i)))
		}
		if v6 && w.chance(0.5) {
			s.ExternalIPs = append(s.ExternalIPs, addr6(0x114, byte(i)))
		}
	}
	if w.chance(0.35) {
		s.LoadBalancerIPs = append(s.LoadBalancerIPs, addr4(203, 0, 113, byte(i)))
		if v6 || w.chance(0.3) {
			s.LoadBalancerIPs = append(s.LoadBalancerIPs, addr6(0x113, byte(i)))
		}
	}
	if w.chance(0.5) {
		ranges := []netip.Prefix{
			netip.MustParsePrefix("192.0.2.0/24"), netip.PrefixFrom(addr4(198, 51, 100, 0), 24+w.pick(9)).Masked(),
			netip.MustParsePrefix("fd00:77::/32"), netip.MustParsePrefix("fd00:c::/64"),
		}
		for _, p := range ranges {
			if w.chance(0.4) {
				s.SourceRanges = append(s.SourceRanges, p)
			}
		}
	}
}

// ports adds one to three ports, some with node ports that other
// services ask for too.
func (w *randomWorld) ports(s *servicelb.Service, i int) {
	protos := []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}
	for j := range 1 + w.pick(3) {
		p := servicelb.Port{Name: fmt.Sprintf("p%d", j), Protocol: protos[w.pick(3)], Port: uint16(80 + j)}
		if w.chance(0.7) {
			p.TargetPort = uint16(8080 + w.pick(2))
		}
		if w.chance(0.4) {
			p.NodePort = uint16(30000 + 3*(i%25) + j)
		}
		s.Ports = append(s.Ports, p)
	}
}

// endpoints returns a few endpoints of service i, some with addresses
// other services use too, some with addresses of their own.
func (w *randomWorld) endpoints(i int) []servicelb.Endpoint {
	var eps []servicelb.Endpoint
	for range w.pick(6) {
		e := servicelb.Endpoint{Ready: new(w.chance(0.8)), Serving: new(w.chance(0.9)), Terminating: w.chance(0.2)}
		e.NodeName = []string{"", "node", "other"}[w.pick(3)]
		e.Zone = []string{"", "a", "b"}[w.pick(3)]
		if w.chance(0.3) {
			e.Weight = servicelb.Weight(uint16(w.pick(5)))
		}
		if w.chance(0.3) {
			e.Hints.ForZones = []string{[]string{"a", "b"}[w.pick(2)]}
		}
		if w.chance(0.2) {
			e.Hints.ForNodes = []string{[]string{"node", "other"}[w.pick(2)]}
		}
		if w.chance(0.2) {
			e.Ports = map[string]uint16{"p0": 9000, fmt.Sprintf("p%d", w.pick(3)): 9001}
			e.OnlyNamedPorts = w.chance(0.5)
		}
		switch w.pick(4) {
		case 0:
			e.Addr = addr4(10, 244, byte(1+w.pick(3)), byte(2+w.pick(4)))
		case 1:
			e.Addr = addr6(0x244, byte(2+w.pick(6)))
		case 2:
			e.Addr = addr4(10, 245, byte(i), byte(1+w.pick(250)))
		default:
			e.Addr = addr6(0x245, byte(i))
		}
		eps = append(eps, e)
	}
	return eps
}

// node returns a random node: its name, zone, addresses and node port
// addresses, cluster and service CIDRs of either family, the local-traffic
// detection, masquerade.
func (w *randomWorld) node() servicelb.NodeConfig {
	n := servicelb.NodeConfig{NodeName: "node", Zone: []string{"", "a"}[w.pick(2)], NodeIPs: []netip.Addr{worldNode4}}
	if w.chance(0.1) {
		n.NodeName = ""
	}
	if w.chance(0.6) {
		n.NodeIPs = append(n.NodeIPs, worldNode6)
	}
	if w.chance(0.2) {
		n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	}
	if w.chance(0.7) {
		n.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	}
	if w.chance(0.5) {
		n.ClusterCIDRs = append(n.ClusterCIDRs, netip.MustParsePrefix("fd00:244::/32"))
	}
	if w.chance(0.5) {
		n.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	}
	n.DetectLocal = servicetest.DetectLocal(w.r)
	n.MasqueradeAll = w.chance(0.2)
	if w.chance(0.2) {
		n.MasqueradeBit = byte(w.pick(20))
	}
	return n
}

// upsert gives b service s.
func (w *randomWorld) upsert(b *servicelb.Builder, s servicelb.Service) error {
	if err := b.Upsert(s); err != nil {
		return err
	}
	w.svcs[s.Name] = s
	return nil
}

// step changes b at random: a new or replaced service, a deleted one, one
// service's endpoints changed, or a new node. It returns the kind of
// change.
func (w *randomWorld) step(b *servicelb.Builder) (string, error) {
	i := w.pick(w.pool)
	switch x := w.pick(20); {
	case x == 0:
		return "node", b.SetNode(w.node())
	case x < 4:
		b.Delete(w.name(i))
		delete(w.svcs, w.name(i))
		return "delete", nil
	case x < 12:
		s, ok := w.svcs[w.name(i)]
		if !ok {
			break
		}
		eps := s.Endpoints
		if len(eps) > 0 && w.chance(0.5) {
			eps = eps[1:]
		}
		s.Endpoints = append(append([]servicelb.Endpoint(nil), eps...), w.endpoints(i)...)
		return "endpoints", w.upsert(b, s)
	}
	return "upsert", w.upsert(b, w.service(i))
}

// builder returns a builder on a random node with half the pool's
// services.
func (w *randomWorld) builder() (*servicelb.Builder, error) {
	b, err := servicelb.NewBuilder(w.node())
	if err != nil {
		return nil, err
	}
	for i := range w.pool / 2 {
		if err := w.upsert(b, w.service(i)); err != nil {
			return nil, err
		}
	}
	return b, nil
}
