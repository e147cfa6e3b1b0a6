package servicelb

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
)

// Backend is an endpoint selected for a service port: where new flows may go.
type Backend struct {
	// Addr and Port are the endpoint's address and target port.
	Addr netip.Addr
	Port uint16
	// Weight is the endpoint's weight, at least 1 (drained endpoints are
	// never selected).
	Weight uint16
	// Local reports whether the endpoint runs on this node.
	Local bool
	// Ready is false for a serving, terminating endpoint selected because
	// no endpoint was ready.
	Ready bool
}

// AddrPort returns the backend's address and port.
func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// String formats the backend as "addr:port".
func (b Backend) String() string { return b.AddrPort().String() }

func compareBackends(a, b Backend) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

// candidate is an endpoint that can serve a service port, before selection.
type candidate struct {
	Backend
	ep      *Endpoint
	serving bool
}

// candidates returns the endpoints of family f that can serve port p, one
// per address and port, drained ones left out. Of two endpoints listed
// with one address and port, the first stays unless the later one is on
// this node, as kube-proxy's endpoint slice cache keeps them: a local
// duplicate wins whatever its conditions.
func candidates(node *NodeConfig, s *Service, p Port, f Family) []candidate {
	return candidatesInto(nil, node, s, p, f)
}

// candidatesInto is candidates, appended to out.
func candidatesInto(out []candidate, node *NodeConfig, s *Service, p Port, f Family) []candidate {
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		port, ok := endpointPort(e, p)
		if !ok || FamilyOf(e.Addr) != f || e.EffectiveWeight() == 0 {
			continue
		}
		out = append(out, candidate{
			Backend: Backend{Addr: e.Addr, Port: port, Weight: e.EffectiveWeight(), Local: node.Local(e), Ready: e.IsReady()},
			ep:      e,
			serving: e.IsReady() || (e.IsServing() && e.Terminating),
		})
	}
	// Sorted stably, the endpoints of one address and port stand
	// together in the order they were listed: the first of them stays,
	// or the last of them on this node.
	slices.SortStableFunc(out, func(a, b candidate) int { return compareBackends(a.Backend, b.Backend) })
	kept := out[:0]
	for i := 0; i < len(out); {
		j, keep := i+1, i
		for ; j < len(out) && out[j].AddrPort() == out[i].AddrPort(); j++ {
			if out[j].Local {
				keep = j
			}
		}
		kept = append(kept, out[keep])
		i = j
	}
	return kept
}

// endpointPort returns the endpoint's port for service port p, and false
// when the endpoint does not serve p.
func endpointPort(e *Endpoint, p Port) (uint16, bool) {
	if port, ok := e.Ports[p.Name]; ok {
		return port, true
	}
	if e.OnlyNamedPorts {
		return 0, false
	}
	return cmp.Or(p.TargetPort, p.Port), true
}

// moreServing returns the endpoints of family f that serve port p (ready,
// or serving), each at its target port of p, whatever their weight, that
// sp's Cluster and Local do not hold: sorted, in a slice of their own;
// nil for none.
func moreServing(s *Service, p Port, f Family, sp *ServicePort) []netip.AddrPort {
	var out []netip.AddrPort
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if tp, ok := endpointPort(e, p); ok && FamilyOf(e.Addr) == f && (e.IsReady() || e.IsServing()) {
			if a := netip.AddrPortFrom(e.Addr, tp); !sp.Serves(a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Clip(slices.Compact(out))
}

// pick returns the ready candidates that keep says yes to or, when there
// are none, the serving terminating ones.
func pick(cs []candidate, keep func(*candidate) bool) []Backend {
	ready, fallback := 0, 0
	for i := range cs {
		c := &cs[i]
		if !keep(c) {
			continue
		}
		if c.Ready {
			ready++
		} else if c.serving {
			fallback++
		}
	}
	n, want := ready, func(c *candidate) bool { return c.Ready }
	if ready == 0 {
		n, want = fallback, func(c *candidate) bool { return !c.Ready && c.serving }
	}
	if n == 0 {
		return nil
	}
	// The service port keeps the slice: sized once, it holds no spare room.
	out := make([]Backend, 0, n)
	for i := range cs {
		if c := &cs[i]; keep(c) && want(c) {
			out = append(out, c.Backend)
		}
	}
	return out
}

// hintScope is how topology hints narrowed a port's cluster-wide choice.
type hintScope uint8

const (
	hintsNone hintScope = iota // they narrowed nothing
	hintsNode                  // to the endpoints hinted for this node
	hintsZone                  // to the endpoints hinted for this node's zone
)

// selectCluster applies topology hints to the cluster-wide choice, as
// kube-proxy's topologyModeFromHints and CategorizeEndpoints do: node
// hints when every ready candidate has one and some name this node, else
// zone hints when every ready candidate has one and some name this node's
// zone, else none. Hints narrow the ready candidates only; the terminating
// fallback ignores them. It returns the choice and how hints narrowed it.
func selectCluster(node *NodeConfig, cs []candidate) ([]Backend, hintScope) {
	all := func(*candidate) bool { return true }
	byNode := func(c *candidate) bool { return slices.Contains(c.ep.Hints.ForNodes, node.NodeName) }
	byZone := func(c *candidate) bool { return slices.Contains(c.ep.Hints.ForZones, node.Zone) }
	var keep func(*candidate) bool
	var scope hintScope
	switch {
	case node.NodeName != "" && hintMode(cs, func(e *Endpoint) []string { return e.Hints.ForNodes }, byNode):
		keep, scope = byNode, hintsNode
	case node.Zone != "" && hintMode(cs, func(e *Endpoint) []string { return e.Hints.ForZones }, byZone):
		keep, scope = byZone, hintsZone
	default:
		return pick(cs, all), hintsNone
	}
	if b := pick(cs, func(c *candidate) bool { return c.Ready && keep(c) }); len(b) > 0 {
		return b, scope
	}
	return pick(cs, all), hintsNone
}

// hintMode reports whether every ready candidate carries hints of one kind
// and some of them are for this node (mine).
func hintMode(cs []candidate, hints func(*Endpoint) []string, mine func(*candidate) bool) bool {
	anyMine := false
	for i := range cs {
		c := &cs[i]
		if !c.Ready {
			continue
		}
		if len(hints(c.ep)) == 0 {
			return false
		}
		anyMine = anyMine || mine(c)
	}
	return anyMine
}

// compilePorts builds the service ports of a validated, normalized
// service. Frontends that another service holds (see claims) are left
// out.
func compilePorts(node *NodeConfig, s *Service, c *claims) []*ServicePort {
	var out []*ServicePort
	for _, f := range serviceFamilies(node, s) {
		for _, p := range s.Ports {
			out = append(out, compilePort(node, s, c, p, f))
		}
	}
	return out
}

// scratch holds the candidates of compilePort between calls: a port keeps
// what it selects of them, not them, and a slice made for each port would
// leave the State's long-lived objects among holes.
var scratch = sync.Pool{New: func() any { return new([]candidate) }}

func compilePort(node *NodeConfig, s *Service, c *claims, p Port, f Family) *ServicePort {
	buf := scratch.Get().(*[]candidate)
	cs := candidatesInto((*buf)[:0], node, s, p, f)
	defer func() {
		clear(cs)
		*buf = cs[:0]
		scratch.Put(buf)
	}()
	cluster, _ := selectCluster(node, cs)
	holds := func(a netip.Addr) bool {
		return FamilyOf(a) == f && c.vipOwner(frontKey{a, p.Protocol, p.Port}) == s.Name
	}
	held := func(as []netip.Addr) []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			if holds(a) {
				out = append(out, a)
			}
		}
		return out
	}
	sp := &ServicePort{
		Key:             ServicePortKey{Service: s.Name, Port: p.Name, Family: f},
		Port:            p,
		Family:          f,
		ExternalIPs:     held(s.ExternalIPs),
		LoadBalancerIPs: held(s.LoadBalancerIPs),
		Scheduler:       s.Scheduler,
		Cluster:         cluster,
		Local:           pick(cs, func(c *candidate) bool { return c.Local }),
	}
	sp.moreServing = moreServing(s, p, f, sp)
	sp.Serving = slices.Clip(sp.ServingEndpoints())
	if i := slices.IndexFunc(s.ClusterIPs, holds); i >= 0 {
		sp.ClusterIP = s.ClusterIPs[i]
	}
	if p.NodePort != 0 && c.nodePortOwner(portKey{p.Protocol, p.NodePort}) == s.Name {
		for _, a := range node.NodePortIPs(f) {
			if !c.vipClaimed(frontKey{a, p.Protocol, p.NodePort}) {
				sp.NodeIPs = append(sp.NodeIPs, a)
			}
		}
	}
	if hc := s.HealthCheckNodePort; hc != 0 && c.healthOwner(hc) == s.Name {
		sp.HealthCheckNodePort = hc
	}
	if s.Affinity.ClientIP {
		sp.Affinity = s.Affinity.Timeout
	}
	if len(sp.LoadBalancerIPs) > 0 {
		sp.SourceRanges = allowedSources(node, s, sp)
	}
	sp.decide(node, s)
	n := 0
	for range sp.HairpinAddrs() {
		n++
	}
	if n > 0 {
		sp.Hairpin = slices.AppendSeq(make([]netip.Addr, 0, n), sp.HairpinAddrs())
	}
	return sp
}

// allowedSources returns the sources allowed to reach a port's
// load-balancer IPs, as kube-proxy's firewall chain admits them: the
// service's ranges of the port's family and, when a node address lies in
// them, the load-balancer IPs as sources too, none inside another. No
// ranges of the family, or
// a range that holds every address, allow every source: nil.
func allowedSources(node *NodeConfig, s *Service, sp *ServicePort) []netip.Prefix {
	ranges := prefixesOf(s.SourceRanges, sp.Family)
	if len(ranges) == 0 || slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return nil
	}
	out := slices.Clone(ranges)
	if slices.ContainsFunc(node.IPs(sp.Family), func(a netip.Addr) bool { return prefixesContain(ranges, a) }) {
		for _, a := range sp.LoadBalancerIPs {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	return disjointPrefixes(out)
}

func comparePrefixes(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// serviceFamilies returns the families a service is served in: those of its
// cluster IPs; without cluster IPs, those of its other addresses; without
// any address, those of the node's addresses when it has a node port.
func serviceFamilies(node *NodeConfig, s *Service) []Family {
	has := map[Family]bool{}
	mark := func(as []netip.Addr) {
		for _, a := range as {
			has[FamilyOf(a)] = true
		}
	}
	mark(s.ClusterIPs)
	if len(has) == 0 {
		mark(s.ExternalIPs)
		mark(s.LoadBalancerIPs)
	}
	if len(has) == 0 && slices.ContainsFunc(s.Ports, func(p Port) bool { return p.NodePort != 0 }) {
		mark(node.NodeIPs)
	}
	var out []Family
	for _, f := range []Family{IPv4, IPv6} {
		if has[f] {
			out = append(out, f)
		}
	}
	return out
}
