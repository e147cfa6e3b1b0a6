package servicelb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"
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

// ServicePortKey names one port of one service in one address family.
type ServicePortKey struct {
	Service string
	Port    string
	Family  Family
}

// String formats the key as "service:port/family", such as
// "default/web:http/ipv4".
func (k ServicePortKey) String() string {
	return fmt.Sprintf("%s:%s/%s", k.Service, k.Port, k.Family)
}

// Compare orders keys by service, port and family.
func (k ServicePortKey) Compare(o ServicePortKey) int {
	return cmp.Or(cmp.Compare(k.Service, o.Service), cmp.Compare(k.Port, o.Port), cmp.Compare(k.Family, o.Family))
}

// ServicePort is what a backend programs: one port of one service in one
// address family, with its addresses and the endpoints selected for it. It
// is immutable: States share it until the service changes.
type ServicePort struct {
	Key ServicePortKey
	// Service is the validated service it belongs to. Read only.
	Service *Service
	Port    Port
	Family  Family
	// ClusterIP is the service's cluster IP of this family, if any.
	ClusterIP netip.Addr
	// ExternalIPs, LoadBalancerIPs and SourceRanges are the service's, of
	// this family.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	SourceRanges    []netip.Prefix
	// NodeIPs are the node addresses of this family that serve NodePort;
	// empty when the port has no node port.
	NodeIPs []netip.Addr
	// InternalLocal and ExternalLocal are the traffic policies. External
	// Local is false for a service with no external address or node port.
	InternalLocal bool
	ExternalLocal bool
	// Affinity is the ClientIP affinity timeout; zero means no affinity.
	Affinity  time.Duration
	Scheduler Scheduler
	// Cluster holds the backends for traffic under the Cluster policy, and
	// Local those for traffic under the Local policy, ordered by address
	// and port. See the package documentation for how they are chosen.
	Cluster []Backend
	Local   []Backend
}

// External reports whether the port is reachable from outside the cluster:
// through a node port, an external IP or a load-balancer IP.
func (sp *ServicePort) External() bool {
	return sp.Port.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// InternalBackends returns the backends for traffic to the cluster IP.
func (sp *ServicePort) InternalBackends() []Backend {
	if sp.InternalLocal {
		return sp.Local
	}
	return sp.Cluster
}

// ExternalBackends returns the backends for traffic to node ports, external
// IPs and load-balancer IPs.
func (sp *ServicePort) ExternalBackends() []Backend {
	if sp.ExternalLocal {
		return sp.Local
	}
	return sp.Cluster
}

// HasBackends reports whether any traffic to the port can be served. A port
// without backends rejects its traffic (ICMP port unreachable or TCP reset);
// one with backends drops the traffic whose policy leaves it none.
func (sp *ServicePort) HasBackends() bool {
	return len(sp.InternalBackends()) > 0 || (sp.External() && len(sp.ExternalBackends()) > 0)
}

// Backends returns every backend either policy selects, without duplicates,
// ordered by address and port.
func (sp *ServicePort) Backends() []Backend {
	out := slices.Clone(sp.InternalBackends())
	if sp.External() && sp.ExternalLocal != sp.InternalLocal {
		out = append(out, sp.ExternalBackends()...)
		slices.SortFunc(out, compareBackends)
		out = slices.CompactFunc(out, func(a, b Backend) bool { return a.AddrPort() == b.AddrPort() })
	}
	return out
}

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
// per address and port (a ready duplicate wins), drained ones left out.
func candidates(node *NodeConfig, s *Service, p Port, f Family) []candidate {
	var out []candidate
	index := map[netip.AddrPort]int{}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if FamilyOf(e.Addr) != f || e.EffectiveWeight() == 0 {
			continue
		}
		port, ok := e.Ports[p.Name]
		if !ok {
			port = cmp.Or(p.TargetPort, p.Port)
		}
		c := candidate{
			Backend: Backend{Addr: e.Addr, Port: port, Weight: e.EffectiveWeight(), Local: node.Local(e), Ready: e.Ready},
			ep:      e,
			serving: e.Ready || (e.Serving && e.Terminating),
		}
		if j, dup := index[c.AddrPort()]; dup {
			if !out[j].Ready && c.Ready {
				out[j] = c
			}
			continue
		}
		index[c.AddrPort()] = len(out)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b candidate) int { return compareBackends(a.Backend, b.Backend) })
	return out
}

// pick returns the ready candidates that keep says yes to or, when there
// are none, the serving terminating ones.
func pick(cs []candidate, keep func(*candidate) bool) []Backend {
	var ready, fallback []Backend
	for i := range cs {
		c := &cs[i]
		if !keep(c) {
			continue
		}
		if c.Ready {
			ready = append(ready, c.Backend)
		} else if c.serving {
			fallback = append(fallback, c.Backend)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return fallback
}

// selectCluster applies topology hints to the cluster-wide choice: only when
// every ready candidate carries hints, and only when some of them name this
// node (then those) or else this node's zone (then those).
func selectCluster(node *NodeConfig, cs []candidate) []Backend {
	all := func(*candidate) bool { return true }
	hinted, anyReady := true, false
	for i := range cs {
		if cs[i].Ready {
			anyReady = true
			hinted = hinted && !cs[i].ep.Hints.Empty()
		}
	}
	if !anyReady || !hinted {
		return pick(cs, all)
	}
	byNode := func(c *candidate) bool {
		return node.NodeName != "" && slices.Contains(c.ep.Hints.ForNodes, node.NodeName)
	}
	byZone := func(c *candidate) bool { return node.Zone != "" && slices.Contains(c.ep.Hints.ForZones, node.Zone) }
	for _, keep := range []func(*candidate) bool{byNode, byZone} {
		if b := pick(cs, func(c *candidate) bool { return c.Ready && keep(c) }); len(b) > 0 {
			return b
		}
	}
	return pick(cs, all)
}

// compilePorts builds the service ports of a validated, normalized service.
func compilePorts(node *NodeConfig, s *Service) []*ServicePort {
	var out []*ServicePort
	for _, f := range serviceFamilies(node, s) {
		for _, p := range s.Ports {
			cs := candidates(node, s, p, f)
			sp := &ServicePort{
				Key:             ServicePortKey{Service: s.Name, Port: p.Name, Family: f},
				Service:         s,
				Port:            p,
				Family:          f,
				ExternalIPs:     addrsOf(s.ExternalIPs, f),
				LoadBalancerIPs: addrsOf(s.LoadBalancerIPs, f),
				SourceRanges:    prefixesOf(s.SourceRanges, f),
				InternalLocal:   s.InternalTrafficPolicy == PolicyLocal,
				Scheduler:       s.Scheduler,
				Cluster:         selectCluster(node, cs),
				Local:           pick(cs, func(c *candidate) bool { return c.Local }),
			}
			if ips := addrsOf(s.ClusterIPs, f); len(ips) > 0 {
				sp.ClusterIP = ips[0]
			}
			if p.NodePort != 0 {
				sp.NodeIPs = node.NodePortIPs(f)
			}
			sp.ExternalLocal = s.ExternalTrafficPolicy == PolicyLocal && sp.External()
			if s.Affinity.ClientIP {
				sp.Affinity = cmp.Or(s.Affinity.Timeout, DefaultAffinityTimeout)
			}
			out = append(out, sp)
		}
	}
	return out
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
