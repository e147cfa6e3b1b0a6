package servicelb

import (
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

// Empty reports whether nothing changed.
func (c *Changes) Empty() bool {
	return !c.NodeChanged && len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// Len returns the number of service ports added, removed or changed.
func (c *Changes) Len() int { return len(c.Added) + len(c.Removed) + len(c.Changed) }

// Diff returns what changed from one State to the next. A nil from means an
// empty state on an unknown node. Services the two States share are skipped
// by identity, and States taken one after another from one Builder (as a
// Runner takes them) are compared by the services changed between them
// alone, so Diff costs what changed, not what is there; only service ports
// of services that changed are compared in full.
func Diff(from, to *State) Changes {
	var c Changes
	if from == nil {
		from = &State{}
		c.NodeChanged = true
	} else if !reflect.DeepEqual(from.node, to.node) {
		c.NodeChanged = true
	}
	service := func(oe, ne *entry) {
		switch {
		case oe == ne:
		case ne == nil:
			c.Removed = append(c.Removed, oe.ports...)
		case oe == nil:
			diffPorts(&c, nil, ne.ports)
		default:
			diffPorts(&c, oe.ports, ne.ports)
		}
	}
	if from.svcs.sameBase(&to.svcs) {
		for _, name := range from.svcs.changedNames(&to.svcs) {
			service(from.svcs.get(name), to.svcs.get(name))
		}
	} else {
		to.svcs.each(func(name string, ne *entry) { service(from.svcs.get(name), ne) })
		from.svcs.each(func(name string, oe *entry) {
			if to.svcs.get(name) == nil {
				service(oe, nil)
			}
		})
	}
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
		case !samePort(old[i], n):
			c.Changed = append(c.Changed, PortChange{Old: old[i], New: n})
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(cur, func(n *ServicePort) bool { return n.Key == o.Key }) {
			c.Removed = append(c.Removed, o)
		}
	}
}

// samePort reports whether two service ports program the same kernel state:
// everything but the Service they point to, which changes with any of its
// other ports.
func samePort(a, b *ServicePort) bool {
	x, y := *a, *b
	x.Service, y.Service = nil, nil
	return reflect.DeepEqual(x, y)
}

// StaleFlow describes conntrack flows that must be deleted after a change,
// because they would otherwise keep sending a UDP or SCTP client's packets
// to a backend that is gone, or past a service that now has backends.
type StaleFlow struct {
	Protocol Protocol
	// Dst and Port match the flow's original destination. A zero Dst
	// matches any destination: flows to a node port.
	Dst  netip.Addr
	Port uint16
	// Endpoint, when valid, matches the flow's reply source: the backend
	// the flow was translated to. Zero matches every flow to Dst and Port.
	Endpoint netip.Addr
}

// StaleFlows returns the conntrack flows the changes leave stale: for UDP
// and SCTP ports, flows to backends that are no longer selected, and all
// flows to a port that had no backends and now has some.
func (c *Changes) StaleFlows() []StaleFlow {
	var out []StaleFlow
	for _, o := range c.Removed {
		out = appendStale(out, o, o.Backends(), false)
	}
	for _, a := range c.Added {
		out = appendStale(out, a, nil, a.HasBackends())
	}
	for _, ch := range c.Changed {
		keep := map[netip.Addr]bool{}
		for _, b := range ch.New.Backends() {
			keep[b.Addr] = true
		}
		var gone []Backend
		for _, b := range ch.Old.Backends() {
			if !keep[b.Addr] {
				gone = append(gone, b)
			}
		}
		// Flows are matched by the old port's addresses, which a change may
		// have removed along with the backends.
		out = appendStale(out, ch.Old, gone, false)
		out = appendStale(out, ch.New, nil, !ch.Old.HasBackends() && ch.New.HasBackends())
	}
	return out
}

func appendStale(out []StaleFlow, sp *ServicePort, gone []Backend, all bool) []StaleFlow {
	if sp.Port.Protocol == TCP || (len(gone) == 0 && !all) {
		return out
	}
	var dsts []netip.Addr
	if sp.ClusterIP.IsValid() {
		dsts = append(dsts, sp.ClusterIP)
	}
	dsts = append(append(dsts, sp.ExternalIPs...), sp.LoadBalancerIPs...)
	var eps []netip.Addr
	if all {
		eps = []netip.Addr{{}}
	}
	for _, b := range gone {
		eps = append(eps, b.Addr)
	}
	slices.SortFunc(eps, netip.Addr.Compare)
	eps = slices.Compact(eps)
	for _, ep := range eps {
		for _, d := range dsts {
			out = append(out, StaleFlow{Protocol: sp.Port.Protocol, Dst: d, Port: sp.Port.Port, Endpoint: ep})
		}
		if sp.Port.NodePort != 0 {
			out = append(out, StaleFlow{Protocol: sp.Port.Protocol, Port: sp.Port.NodePort, Endpoint: ep})
		}
	}
	return out
}
