package servicelb

import (
	"cmp"
	"net/netip"
	"reflect"
	"slices"
)

// Changes are the differences between two States, by service port: what a
// backend must rewrite. Each list is ordered by key.
type Changes struct {
	// NodeChanged is set when the NodeConfig differs, or when there is no
	// previous state: node-wide rules must be rewritten.
	NodeChanged bool
	Added       []*ServicePort
	Removed     []*ServicePort
	Changed     []PortChange
}

// PortChange is a service port present in both States with different content.
type PortChange struct {
	Old, New *ServicePort
}

// EndpointsOnly reports whether the change touches the port's endpoints
// alone: the sets it forwards to (Cluster, Local), their addresses
// (Hairpin) and the serving endpoints (Serving) differ, and every other
// field, the frontends and the verdicts among them, stays. A backend that
// keeps its endpoints apart from the rules that reach them rewrites only
// those for such a change.
func (c PortChange) EndpointsOnly() bool {
	x := *c.New
	x.Cluster, x.Local, x.Hairpin, x.Serving, x.moreServing = c.Old.Cluster, c.Old.Local, c.Old.Hairpin, c.Old.Serving, c.Old.moreServing
	return x.Equal(c.Old)
}

// Empty reports whether nothing changed.
func (c *Changes) Empty() bool {
	return !c.NodeChanged && len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Len returns the number of service ports added, removed or changed.
func (c *Changes) Len() int { return len(c.Added) + len(c.Removed) + len(c.Changed) }

// Diff returns what changed from one State to the next. A nil from means an
// empty state on an unknown node. Services the two States share are skipped
// by identity, and States made from one another (by one Builder, as a
// Runner takes them, by Edit, or by Without) share every part of their
// index that holds no change, which Diff skips whole: it costs what
// changed (O(log n) a service), not what is there; only service ports of
// services that changed are compared in full.
func Diff(from, to *State) Changes {
	var c Changes
	if from == nil {
		from = &State{}
		c.NodeChanged = true
	} else {
		c.NodeChanged = !reflect.DeepEqual(from.node, to.node)
	}
	same := func(a, b *entry) bool { return a == b }
	from.svcs.diff(&to.svcs.pmap, same, func(_ string, oe, ne *entry, _, _ bool) {
		switch {
		case ne == nil:
			c.Removed = append(c.Removed, oe.ports...)
		case oe == nil:
			diffPorts(&c, nil, ne.ports)
		default:
			diffPorts(&c, oe.ports, ne.ports)
		}
	})
	byKey := func(a, b *ServicePort) int { return a.Key.Compare(b.Key) }
	slices.SortFunc(c.Added, byKey)
	slices.SortFunc(c.Removed, byKey)
	slices.SortFunc(c.Changed, func(a, b PortChange) int { return a.New.Key.Compare(b.New.Key) })
	return c
}

func diffPorts(c *Changes, old, cur []*ServicePort) {
	for _, n := range cur {
		i := slices.IndexFunc(old, func(o *ServicePort) bool { return o.Key == n.Key })
		switch {
		case i < 0:
			c.Added = append(c.Added, n)
		case !old[i].Equal(n):
			c.Changed = append(c.Changed, PortChange{Old: old[i], New: n})
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(cur, func(n *ServicePort) bool { return n.Key == o.Key }) {
			c.Removed = append(c.Removed, o)
		}
	}
}

// Equal reports whether two service ports program the same kernel
// state: a ServicePort holds all a backend reads, so every field counts
// (a test keeps this list whole). An empty list and none are the same.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	return sp.Key == o.Key && sp.Port == o.Port && sp.Family == o.Family && sp.ClusterIP == o.ClusterIP &&
		slices.Equal(sp.ExternalIPs, o.ExternalIPs) && slices.Equal(sp.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(sp.NodeIPs, o.NodeIPs) && slices.Equal(sp.Cluster, o.Cluster) && slices.Equal(sp.Local, o.Local) &&
		sp.Internal == o.Internal && sp.External == o.External && slices.Equal(sp.SourceRanges, o.SourceRanges) &&
		sp.Affinity == o.Affinity && sp.Scheduler == o.Scheduler && sp.HealthCheckNodePort == o.HealthCheckNodePort &&
		slices.Equal(sp.Hairpin, o.Hairpin) && slices.Equal(sp.Serving, o.Serving) && slices.Equal(sp.moreServing, o.moreServing)
}

// StaleFlow selects the UDP or SCTP conntrack flows to one frontend that
// must be deleted: those whose endpoint (the flow's reply source address
// and port) does not serve the frontend, while others do. Such a flow
// would keep sending a client's datagrams to an endpoint that is gone, to
// a target port the service no longer names, or past a service that
// gained endpoints after the flow began, where a serving endpoint could
// take them. Flows to endpoints that still serve are kept, even when the
// policies, topology or weights no longer select them, so that a UDP
// session behaves as a TCP connection does; and a frontend that no
// endpoint serves, or that went away, has no StaleFlow: its flows run on
// until they idle out (kube-proxy's CleanStaleEntries, from 1.31).
type StaleFlow struct {
	Protocol Protocol
	// Dst and Port are the frontend: the flow's original destination.
	Dst  netip.Addr
	Port uint16
	// Serving lists, sorted, the endpoints (address and target port)
	// whose flows to the frontend stay; never empty.
	Serving []netip.AddrPort
}

// Keeps reports whether a flow to the frontend whose reply comes from
// endpoint stays.
func (f *StaleFlow) Keeps(endpoint netip.AddrPort) bool {
	_, found := slices.BinarySearchFunc(f.Serving, endpoint, netip.AddrPort.Compare)
	return found
}

// flowKey is a UDP or SCTP frontend.
type flowKey struct {
	proto Protocol
	addr  netip.Addr
	port  uint16
}

// flowFrontends adds the UDP and SCTP frontends of sp, with the endpoints
// serving them, to m.
func flowFrontends(m map[flowKey][]netip.AddrPort, sp *ServicePort) {
	if sp.Port.Protocol == TCP {
		return
	}
	serving := sp.ServingEndpoints()
	for f := range sp.AllFrontends() {
		k := flowKey{sp.Port.Protocol, f.Addr, f.Port}
		m[k] = mergeAddrs(m[k], serving)
	}
}

func mergeAddrs(a, b []netip.AddrPort) []netip.AddrPort {
	if len(a) == 0 {
		return b
	}
	out := slices.Concat(a, b)
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// StaleFlows returns the conntrack filters the changes call for: one per
// UDP or SCTP frontend that endpoints serve after the changes, where one
// of them stopped serving or none served before. A frontend left with no
// serving endpoint, or gone, has none (see StaleFlow).
func (c *Changes) StaleFlows() []StaleFlow {
	before, after := map[flowKey][]netip.AddrPort{}, map[flowKey][]netip.AddrPort{}
	for _, sp := range c.Removed {
		flowFrontends(before, sp)
	}
	for _, sp := range c.Added {
		flowFrontends(after, sp)
	}
	for _, ch := range c.Changed {
		flowFrontends(before, ch.Old)
		flowFrontends(after, ch.New)
	}
	var out []StaleFlow
	add := func(k flowKey) {
		out = append(out, StaleFlow{Protocol: k.proto, Dst: k.addr, Port: k.port, Serving: after[k]})
	}
	for k, old := range before {
		now := after[k]
		if len(now) == 0 {
			continue
		}
		if len(old) == 0 || slices.ContainsFunc(old, func(a netip.AddrPort) bool {
			_, ok := slices.BinarySearchFunc(now, a, netip.AddrPort.Compare)
			return !ok
		}) {
			add(k)
		}
	}
	for k, now := range after {
		if _, ok := before[k]; !ok && len(now) > 0 {
			add(k)
		}
	}
	sortStale(out)
	return out
}

// StaleFlows returns a filter for every UDP and SCTP frontend of the
// state that endpoints serve, with those endpoints: all a conntrack table
// needs to be reconciled with the state, as after a restart.
func (s *State) StaleFlows() []StaleFlow {
	m := map[flowKey][]netip.AddrPort{}
	s.svcs.each(func(_ string, e *entry) {
		for _, sp := range e.ports {
			flowFrontends(m, sp)
		}
	})
	out := make([]StaleFlow, 0, len(m))
	for k, serving := range m {
		if len(serving) > 0 {
			out = append(out, StaleFlow{Protocol: k.proto, Dst: k.addr, Port: k.port, Serving: serving})
		}
	}
	sortStale(out)
	return out
}

func sortStale(fs []StaleFlow) {
	slices.SortFunc(fs, func(a, b StaleFlow) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.Dst.Compare(b.Dst), cmp.Compare(a.Port, b.Port))
	})
}
