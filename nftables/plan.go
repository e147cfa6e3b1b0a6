package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The plan is the desired content of the table, built from a State in two
// parts: the node's (base chains, the fixed chains, the CIDR sets) and one
// fragment per service port (its chains and its elements in the shared
// sets). Fragments are independent of each other, so a sync rebuilds only
// those of the service ports that changed and writes only their difference.

// chainPlan is a chain and its rules.
type chainPlan struct {
	name  string
	hook  *nfnl.Hook
	rules []*rule
}

// nodePlan is the part of the table that depends on the node only.
type nodePlan struct {
	chains []chainPlan
	elems  map[setID][]elem
}

// portPlan is one service port's fragment of the table.
type portPlan struct {
	key    servicelb.ServicePortKey
	chains []chainPlan
	// elems holds the port's elements by set. The hairpin set is kept
	// apart: several ports may share an endpoint address.
	elems   map[setID][]elem
	hairpin []netip.Addr
	slots   []slotKey
	// shards are the backends maps the port's rules read.
	shards []setID
}

// planner builds plans for one table. The rules every port shares are made
// (and encoded) once.
type planner struct {
	table        string
	affinitySize uint32
	drop         *rule
	jumpMark     *rule
	fibMark      *rule
	masqOutside  [2]*rule // per family: traffic from outside the cluster CIDRs
}

func newPlanner(table string, affinitySize uint32) *planner {
	p := &planner{
		table:        table,
		affinitySize: affinitySize,
		drop:         mk(drop()),
		jumpMark:     mk(jump(chainMarkMasq)),
		fibMark:      mk(fibLocalSource(), jump(chainMarkMasq)),
	}
	for _, f := range families {
		p.masqOutside[famIndex(f)] = mk(inSet(f, true, true, fixedSet(kindClusterCIDRs, f).name()), jump(chainMarkMasq))
	}
	return p
}

func baseChain(name string, hook uint32, prio int32, rules ...*rule) chainPlan {
	accept := nfnl.VerdictAccept
	return chainPlan{name: name, hook: &nfnl.Hook{Num: hook, Priority: prio, Type: "nat", Policy: &accept}, rules: rules}
}

var families = [2]servicelb.Family{servicelb.IPv4, servicelb.IPv6}

// node plans the node-wide chains and elements.
func (p *planner) node(n *servicelb.NodeConfig) nodePlan {
	m := n.MasqueradeMark()
	var masq, svc []*rule
	for _, f := range families {
		masq = append(masq, mk(ctDNAT(), hairpinIn(f, fixedSet(kindHairpin, f).name()), masquerade()))
	}
	masq = append(masq, mk(markClear(m), returnVerdict()), mk(markSetXor(m)), mk(masquerade()))
	for _, f := range families {
		svc = append(svc, mk(entryIn(f, fixedSet(kindFirewall, f).name()), entrySourceNotIn(f, fixedSet(kindFirewallPass, f).name()), drop()))
	}
	for _, f := range families {
		ne := fixedSet(kindNoEndpoints, f).name()
		svc = append(svc, mk(l4proto(servicelb.TCP), entryIn(f, ne), reject(f, true)), mk(entryIn(f, ne), reject(f, false)))
	}
	for _, f := range families {
		svc = append(svc, mk(entryVmap(f, fixedSet(kindServices, f).name())))
	}
	for _, f := range families {
		svc = append(svc, mk(inSet(f, false, false, fixedSet(kindServiceCIDRs, f).name()), drop()))
	}
	np := nodePlan{
		chains: []chainPlan{
			baseChain(chainNatPrerouting, nfnl.HookPrerouting, -100, mk(jump(chainServices))),
			baseChain(chainNatOutput, nfnl.HookOutput, -100, mk(jump(chainServices))),
			baseChain(chainNatPostrouting, nfnl.HookPostrouting, 100, mk(jump(chainMasquerading))),
			{name: chainMarkMasq, rules: []*rule{mk(markSetOr(m))}},
			{name: chainMasquerading, rules: masq},
			{name: chainServices, rules: svc},
		},
		elems: map[setID][]elem{},
	}
	for _, f := range families {
		np.elems[fixedSet(kindClusterCIDRs, f)] = cidrElems(prefixesOf(n.ClusterCIDRs, f))
		np.elems[fixedSet(kindServiceCIDRs, f)] = cidrElems(prefixesOf(n.ServiceCIDRs, f))
	}
	return np
}

func prefixesOf(ps []netip.Prefix, f servicelb.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if servicelb.FamilyOf(p.Addr()) == f {
			out = append(out, p.Masked())
		}
	}
	return disjoint(out)
}

// disjoint drops prefixes that another one contains: the kernel refuses
// overlapping intervals.
func disjoint(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if a.Bits() != b.Bits() {
			return a.Bits() - b.Bits()
		}
		return a.Addr().Compare(b.Addr())
	})
	var out []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Contains(p.Addr()) }) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

func cidrElems(ps []netip.Prefix) []elem {
	var out []elem
	for _, p := range ps {
		out = append(out, prefixElems(p)...)
	}
	return out
}

// port plans one service port. slots assigns the port's load-balancing
// slots; the caller commits or drops the assignment with the sync.
func (p *planner) port(sp *servicelb.ServicePort, n *servicelb.NodeConfig, slots *slotTxn) (*portPlan, error) {
	k := sp.Key
	if sp.Scheduler != servicelb.SchedulerDefault && sp.Scheduler != servicelb.SchedulerRandom {
		return nil, fmt.Errorf("nftables: service %q: scheduler %q: %w: only random (weighted) spreading", k.Service, sp.Scheduler, ErrUnsupported)
	}
	pp := &portPlan{key: k, elems: make(map[setID][]elem, 2)}
	useLocal := (sp.ClusterIP.IsValid() && sp.InternalLocal) || sp.ExternalLocal
	useCluster := (sp.ClusterIP.IsValid() && !sp.InternalLocal) || sp.External()
	var cluster, local balancer
	var err error
	if useCluster {
		if cluster, err = p.lb(pp, sp, slotKey{port: k}, sp.Cluster, slots); err != nil {
			return nil, err
		}
	}
	if useLocal {
		if local, err = p.lb(pp, sp, slotKey{port: k, local: true}, sp.Local, slots); err != nil {
			return nil, err
		}
	}
	var chains []chainPlan
	if sp.ClusterIP.IsValid() {
		internal := cluster
		if sp.InternalLocal {
			internal = local
		}
		chains = append(chains, chainPlan{name: chainInternal(k), rules: p.internalRules(sp, n, internal)})
	}
	if sp.External() {
		chains = append(chains, chainPlan{name: chainExternal(k), rules: p.externalRules(sp, n, cluster, local)})
	}
	pp.chains = append(chains, pp.chains...)
	p.entries(pp, sp, n)
	pp.hairpin = hairpinAddrs(sp, n)
	return pp, nil
}

// hairpinAddrs returns the endpoint addresses whose packets to the service
// may come back to them through this node: the local endpoints, as
// servicelb tells them (an endpoint on another node reaches its services
// through the proxier of its own node), or all of them when the node has no
// name and so no endpoint is known to be local. The plan of a port depends
// on the ServicePort and the node only, which is what servicelb.Diff
// compares.
func hairpinAddrs(sp *servicelb.ServicePort, n *servicelb.NodeConfig) []netip.Addr {
	var out []netip.Addr
	for _, b := range sp.Backends() {
		if b.Local || n.NodeName == "" {
			out = append(out, b.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func (p *planner) internalRules(sp *servicelb.ServicePort, n *servicelb.NodeConfig, lb balancer) []*rule {
	rs := make([]*rule, 0, 3)
	switch {
	case n.MasqueradeAll:
		rs = append(rs, p.jumpMark)
	case hasFamily(n.ClusterCIDRs, sp.Family):
		rs = append(rs, p.masqOutside[famIndex(sp.Family)])
	}
	return append(rs, lb.rule(), p.drop)
}

func hasFamily(ps []netip.Prefix, f servicelb.Family) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return servicelb.FamilyOf(p.Addr()) == f })
}

// externalRules send node port, external IP and load-balancer traffic to
// its endpoints. Under the Local policy the client's address is kept, but
// traffic from pods and from the node itself takes the cluster-wide
// endpoints, as kube-proxy does.
func (p *planner) externalRules(sp *servicelb.ServicePort, n *servicelb.NodeConfig, cluster, local balancer) []*rule {
	if !sp.ExternalLocal {
		return []*rule{p.jumpMark, cluster.rule(), p.drop}
	}
	var rs []*rule
	f := sp.Family
	if hasFamily(n.ClusterCIDRs, f) {
		rs = append(rs, cluster.rule(inSet(f, true, false, fixedSet(kindClusterCIDRs, f).name())))
	}
	return append(rs, p.fibMark, cluster.rule(fibLocalSource()), local.rule(), p.drop)
}

// balancer spreads a port's traffic over one set of endpoints: with a rule
// that translates at once (dnat terms), or through the chain that holds an
// affinity port's rules.
type balancer struct {
	chain string
	dnat  []term
}

// rule matches the terms, then balances.
func (b balancer) rule(match ...term) *rule {
	if b.chain != "" {
		return mk(append(match, goTo(b.chain))...)
	}
	return mk(append(match, b.dnat...)...)
}

// lb plans the load balancing over bs. Without affinity it is one rule
// term that reads the slot's ranges in a backends map, written into the
// chains that use it; with affinity it is a chain of its own with a rule per
// endpoint, since a pinned client must find its own endpoint.
func (p *planner) lb(pp *portPlan, sp *servicelb.ServicePort, key slotKey, bs []servicelb.Backend, slots *slotTxn) (balancer, error) {
	slot, err := slots.get(key)
	if err != nil {
		return balancer{}, err
	}
	pp.slots = append(pp.slots, key)
	f, proto := sp.Family, sp.Port.Protocol
	if sp.Affinity > 0 {
		ch := chainPlan{name: key.chain(), rules: affinityRules(f, proto, fixedSet(kindAffinity, f).name(), slot, bs, sp.Affinity)}
		pp.chains = append(pp.chains, chainPlan{name: ch.name, rules: append(ch.rules, p.drop)})
		return balancer{chain: ch.name}, nil
	}
	set := shardSet(f, slot)
	pp.shards = append(pp.shards, set)
	if len(bs) > 0 {
		counts := bucketCounts(bs)
		if counts == nil {
			return balancer{}, fmt.Errorf("nftables: %s: %d endpoints: %w: at most %d endpoints per service port", sp.Key, len(bs), ErrCapacity, buckets)
		}
		pp.elems[set] = append(pp.elems[set], backendElems(slot, bs, counts)...)
	}
	return balancer{dnat: []term{l4proto(proto), dnatMap(f, slot*bucketStride, set.name())}}, nil
}

// affinityRules pick an endpoint for a client pinned to none (at random,
// in proportion to the weights: each rule takes its endpoint with
// probability weight / remaining weight) and keep a pinned client on its
// endpoint, refreshing the pin with every new connection.
func affinityRules(f servicelb.Family, proto servicelb.Protocol, set string, slot uint32, bs []servicelb.Backend, to time.Duration) []*rule {
	rs := make([]*rule, 0, 2*len(bs))
	for _, b := range bs {
		ep := endpointID(b.AddrPort())
		rs = append(rs, mk(affinityHit(f, set, slot, ep), affinityUpdate(f, set, slot, ep, to), l4proto(proto), dnatTo(f, b.AddrPort())))
	}
	var remaining uint32
	for _, b := range bs {
		remaining += uint32(b.Weight)
	}
	for i, b := range bs {
		ep := endpointID(b.AddrPort())
		terms := []term{affinityUpdate(f, set, slot, ep, to), l4proto(proto), dnatTo(f, b.AddrPort())}
		if i < len(bs)-1 {
			terms = append([]term{randomBelow(remaining, uint32(b.Weight))}, terms...)
		}
		rs = append(rs, mk(terms...))
		remaining -= uint32(b.Weight)
	}
	return rs
}

// entries plans the port's elements in the dispatch, reject and firewall
// sets.
func (p *planner) entries(pp *portPlan, sp *servicelb.ServicePort, n *servicelb.NodeConfig) {
	f, k, proto, port := sp.Family, sp.Key, sp.Port.Protocol, sp.Port.Port
	n0 := len(sp.ExternalIPs) + len(sp.LoadBalancerIPs) + len(sp.NodeIPs) + 1
	ents, rejects := make([]elem, 0, n0), []elem(nil)
	noBackends := !sp.HasBackends()
	add := func(a netip.Addr, port uint16, chain string) {
		key := entryBytes(a, proto, port)
		ents = append(ents, elem{key: key, chain: chain})
		if noBackends {
			rejects = append(rejects, elem{key: key})
		}
	}
	if sp.ClusterIP.IsValid() {
		add(sp.ClusterIP, port, chainInternal(k))
	}
	if sp.External() {
		ext := chainExternal(k)
		for _, a := range sp.ExternalIPs {
			add(a, port, ext)
		}
		for _, a := range sp.LoadBalancerIPs {
			add(a, port, ext)
		}
		for _, a := range sp.NodeIPs {
			add(a, sp.Port.NodePort, ext)
		}
	}
	pp.elems[fixedSet(kindServices, f)] = ents
	if noBackends {
		pp.elems[fixedSet(kindNoEndpoints, f)] = rejects
	}
	if len(sp.SourceRanges) == 0 || len(sp.LoadBalancerIPs) == 0 {
		return
	}
	allowed := disjoint(slices.Concat(sp.SourceRanges, hostPrefixes(n.IPs(f))))
	fw, pass := fixedSet(kindFirewall, f), fixedSet(kindFirewallPass, f)
	for _, a := range sp.LoadBalancerIPs {
		pp.elems[fw] = append(pp.elems[fw], elem{key: entryBytes(a, proto, port)})
		for _, src := range allowed {
			pp.elems[pass] = append(pp.elems[pass], firewallElem(a, proto, port, src))
		}
	}
}

func hostPrefixes(as []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(as))
	for _, a := range as {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}
