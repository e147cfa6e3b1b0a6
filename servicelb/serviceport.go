package servicelb

import (
	"cmp"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"time"
)

// ServicePortKey names one port of one service in one address family.
type ServicePortKey struct {
	Service string
	Port    string
	Family  Family
}

// String formats the key as "service:port/family", such as
// "default/web:http/ipv4".
func (k ServicePortKey) String() string {
	return k.Service + ":" + k.Port + "/" + k.Family.String()
}

// Compare orders keys by service, port and family.
func (k ServicePortKey) Compare(o ServicePortKey) int {
	return cmp.Or(cmp.Compare(k.Service, o.Service), cmp.Compare(k.Port, o.Port), cmp.Compare(k.Family, o.Family))
}

// ServicePort is the complete decision for one port of one service in one
// address family: everything a backend programs, and all a backend may
// read. Backends render it; they decide nothing about a service's meaning
// themselves, and Diff compares every field, so an incremental sync
// applies exactly what a fresh one would. It is immutable: States share it
// until the service changes.
type ServicePort struct {
	Key  ServicePortKey
	Port Port
	// Family is the address family of every address below.
	Family Family

	// The frontends: where the port is reached. ClusterIP is invalid when
	// the service has none of this family, or when another service holds
	// the address and port (see State.Conflicts). NodeIPs are the node
	// addresses that serve Port.NodePort; empty without a node port.
	ClusterIP       netip.Addr
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	NodeIPs         []netip.Addr

	// Cluster holds the endpoints for traffic under the Cluster policy,
	// and Local those for traffic under the Local policy, ordered by
	// address and port. See the package documentation for how they are
	// chosen.
	Cluster []Backend
	Local   []Backend

	// Internal is the verdict, by origin, for traffic to the cluster IP;
	// External for traffic to node ports, external IPs and load-balancer
	// IPs. See Verdict and the package documentation.
	Internal Verdicts
	External Verdicts

	// SourceRanges, when not empty, are the only sources whose traffic to
	// the load-balancer IPs is forwarded; traffic of other sources is
	// dropped. They are the service's ranges of this family, plus the
	// load-balancer IPs themselves when a node address lies in the
	// ranges (a node reaching a load-balancer IP it holds uses that
	// address as source). Empty means every source is allowed, as for a
	// service whose ranges are all of the other family.
	SourceRanges []netip.Prefix
	// Affinity is the ClientIP affinity timeout, a whole number of
	// seconds; zero means no affinity.
	Affinity time.Duration
	// Scheduler is the service's hint, one the backend's Capabilities
	// accept.
	Scheduler Scheduler
	// HealthCheckNodePort is the service's health check node port, 0 for
	// none. Backends that filter node traffic accept TCP on it.
	HealthCheckNodePort uint16
	// Hairpin lists the addresses HairpinAddrs yields.
	//
	// Deprecated: read HairpinAddrs or IsHairpin, which read Cluster and
	// Local. The next minor release removes the list (24 bytes an
	// endpoint).
	Hairpin []netip.Addr
	// Serving lists the endpoints ServingEndpoints returns.
	//
	// Deprecated: read ServingEndpoints or Serves, which read Cluster,
	// Local and the few other serving endpoints the port keeps. The next
	// minor release removes the list (32 bytes an endpoint).
	Serving []netip.AddrPort
	// moreServing are the serving endpoints beyond those of Cluster and
	// Local (none, as a rule), sorted.
	moreServing []netip.AddrPort
}

// ExternallyAccessible reports whether the port is reachable from outside the cluster:
// through a node port, an external IP or a load-balancer IP.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.Port.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// Verdicts returns the verdicts for frontends of kind k.
func (sp *ServicePort) Verdicts(k FrontendKind) Verdicts {
	if k == ClusterIPFrontend {
		return sp.Internal
	}
	return sp.External
}

// Targets returns the endpoints a verdict forwards to: Cluster, Local, or
// none.
func (sp *ServicePort) Targets(v Verdict) []Backend {
	switch v.Action {
	case ToCluster:
		return sp.Cluster
	case ToLocal:
		return sp.Local
	}
	return nil
}

// Uses reports whether some verdict of the port forwards to the Cluster
// set (a == ToCluster) or to the Local set (a == ToLocal).
func (sp *ServicePort) Uses(a Action) bool {
	for o := range numOrigins {
		if sp.ClusterIP.IsValid() && sp.Internal[o].Action == a {
			return true
		}
		if sp.ExternallyAccessible() && sp.External[o].Action == a {
			return true
		}
	}
	return false
}

// Backends returns every endpoint a verdict of the port forwards to,
// without duplicates, ordered by address and port.
func (sp *ServicePort) Backends() []Backend {
	var out []Backend
	if sp.Uses(ToCluster) {
		out = append(out, sp.Cluster...)
	}
	if sp.Uses(ToLocal) {
		out = append(out, sp.Local...)
		slices.SortFunc(out, compareBackends)
		out = slices.CompactFunc(out, func(a, b Backend) bool { return a.AddrPort() == b.AddrPort() })
	}
	return out
}

// ServingEndpoints returns every endpoint of this family that serves the
// port (ready, or serving while terminating), at its target port, whatever
// the policies, topology or weights select, sorted. A UDP or SCTP flow to
// a frontend of the port whose endpoint address and port are not among
// them is stale (see StaleFlow). They are those of Cluster and Local, and
// the few the port keeps beside them.
func (sp *ServicePort) ServingEndpoints() []netip.AddrPort {
	n := len(sp.Cluster) + len(sp.Local) + len(sp.moreServing)
	if n == 0 {
		return nil
	}
	out := make([]netip.AddrPort, 0, n)
	for _, bs := range [2][]Backend{sp.Cluster, sp.Local} {
		for _, b := range bs {
			out = append(out, b.AddrPort())
		}
	}
	out = append(out, sp.moreServing...)
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// Serves reports whether the endpoint at a (its address and target port)
// is among those ServingEndpoints returns, without making the list.
func (sp *ServicePort) Serves(a netip.AddrPort) bool {
	for _, bs := range [2][]Backend{sp.Cluster, sp.Local} {
		if _, ok := slices.BinarySearchFunc(bs, a, func(b Backend, a netip.AddrPort) int { return b.AddrPort().Compare(a) }); ok {
			return true
		}
	}
	_, ok := slices.BinarySearchFunc(sp.moreServing, a, netip.AddrPort.Compare)
	return ok
}

// HairpinAddrs yields the addresses of the endpoints a verdict may forward to
// (those of Backends), each once, in order: a flow from one of them that
// is forwarded to itself is masqueraded, so that the endpoint's reply
// comes back through the node. They are read from Cluster and Local, not
// kept beside them.
func (sp *ServicePort) HairpinAddrs() iter.Seq[netip.Addr] {
	return func(yield func(netip.Addr) bool) {
		c, l := sp.hairpinSets()
		var last netip.Addr
		for len(c) > 0 || len(l) > 0 {
			var a netip.Addr
			switch {
			case len(l) == 0 || len(c) > 0 && c[0].Addr.Compare(l[0].Addr) <= 0:
				a, c = c[0].Addr, c[1:]
			default:
				a, l = l[0].Addr, l[1:]
			}
			if a == last {
				continue
			}
			if !yield(a) {
				return
			}
			last = a
		}
	}
}

// IsHairpin reports whether a is among the addresses HairpinAddrs yields.
func (sp *ServicePort) IsHairpin(a netip.Addr) bool {
	c, l := sp.hairpinSets()
	for _, bs := range [2][]Backend{c, l} {
		i, _ := slices.BinarySearchFunc(bs, a, func(b Backend, a netip.Addr) int { return b.Addr.Compare(a) })
		if i < len(bs) && bs[i].Addr == a {
			return true
		}
	}
	return false
}

// hairpinSets returns the port's sets of endpoints a verdict forwards to:
// Cluster, Local, or none for a set no verdict uses.
func (sp *ServicePort) hairpinSets() (c, l []Backend) {
	if sp.Uses(ToCluster) {
		c = sp.Cluster
	}
	if sp.Uses(ToLocal) {
		l = sp.Local
	}
	return c, l
}

// Frontend is one address and port where a service port is reached.
type Frontend struct {
	Kind FrontendKind
	Addr netip.Addr
	Port uint16
}

// AddrPort returns the frontend's address and port.
func (f Frontend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(f.Addr, f.Port) }

// String formats the frontend as "kind addr:port".
func (f Frontend) String() string { return f.Kind.String() + " " + f.AddrPort().String() }

// Frontends returns every frontend of the port, in AllFrontends' order.
func (sp *ServicePort) Frontends() []Frontend {
	return slices.AppendSeq(make([]Frontend, 0, 1+len(sp.ExternalIPs)+len(sp.LoadBalancerIPs)+len(sp.NodeIPs)), sp.AllFrontends())
}

// AllFrontends yields every frontend of the port: its cluster IP, external
// IPs and load-balancer IPs with the port, and its node addresses with the
// node port.
func (sp *ServicePort) AllFrontends() iter.Seq[Frontend] {
	return func(yield func(Frontend) bool) {
		if sp.ClusterIP.IsValid() && !yield(Frontend{ClusterIPFrontend, sp.ClusterIP, sp.Port.Port}) {
			return
		}
		for _, a := range sp.ExternalIPs {
			if !yield(Frontend{ExternalIPFrontend, a, sp.Port.Port}) {
				return
			}
		}
		for _, a := range sp.LoadBalancerIPs {
			if !yield(Frontend{LoadBalancerFrontend, a, sp.Port.Port}) {
				return
			}
		}
		for _, a := range sp.NodeIPs {
			if !yield(Frontend{NodePortFrontend, a, sp.Port.NodePort}) {
				return
			}
		}
	}
}

// String sums the port up on one line, for logs and test failures.
func (sp *ServicePort) String() string {
	return fmt.Sprintf("%s %s internal[%s] external[%s] cluster=%v local=%v", sp.Key, sp.Port.Protocol,
		sp.Internal, sp.External, sp.Cluster, sp.Local)
}
