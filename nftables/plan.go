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
	rules []rule
}

// nodePlan is the part of the table that depends on the node only.
type nodePlan struct {
	chains []chainPlan
	elems  map[string][]elem
}

// portPlan is one service port's fragment of the table.
type portPlan struct {
	key    servicelb.ServicePortKey
	chains []chainPlan
	// elems maps set names to the port's elements in them. The hairpin
	// set is kept apart: several ports may share an endpoint address.
	elems   map[string][]elem
	hairpin []netip.Addr
	slots   []slotKey
	// shards are the backends maps the port's rules read.
	shards []string
}

// planner builds plans for one table.
type planner struct {
	table        string
	affinitySize uint32
}

func baseChain(name string, hook uint32, prio int32, rules ...rule) chainPlan {
	accept := nfnl.VerdictAccept
	return chainPlan{name: name, hook: &nfnl.Hook{Num: hook, Priority: prio, Type: "nat", Policy: &accept}, rules: rules}
}

var families = []servicelb.Family{servicelb.IPv4, servicelb.IPv6}

// node plans the node-wide chains and elements.
func (p *planner) node(n *servicelb.NodeConfig) nodePlan {
	m := n.MasqueradeMark()
	masq := []rule{}
	for _, f := range families {
		masq = append(masq, mk(ctDNAT(), hairpinIn(f, setName(setHairpin, f)), masquerade()))
	}
	masq = append(masq, mk(markClear(m), returnVerdict()), mk(markSetXor(m)), mk(masquerade()))
	var svc []rule
	for _, f := range families {
		svc = append(svc, mk(entryIn(f, setName(setFirewall, f)), entrySourceNotIn(f, setName(setFirewallPass, f)), drop()))
	}
	for _, f := range families {
		ne := setName(setNoEndpoints, f)
		svc = append(svc, mk(l4proto(servicelb.TCP), entryIn(f, ne), reject(f, true)), mk(entryIn(f, ne), reject(f, false)))
	}
	for _, f := range families {
		svc = append(svc, mk(entryVmap(f, setName(setServices, f))))
	}
	for _, f := range families {
		svc = append(svc, mk(inSet(f, false, false, setName(setServiceCIDRs, f)), drop()))
	}
	np := nodePlan{
		chains: []chainPlan{
			baseChain(chainNatPrerouting, nfnl.HookPrerouting, -100, mk(jump(chainServices))),
			baseChain(chainNatOutput, nfnl.HookOutput, -100, mk(jump(chainServices))),
			baseChain(chainNatPostrouting, nfnl.HookPostrouting, 100, mk(jump(chainMasquerading))),
			{name: chainMarkMasq, rules: []rule{mk(markSetOr(m))}},
			{name: chainMasquerading, rules: masq},
			{name: chainServices, rules: svc},
		},
		elems: map[string][]elem{},
	}
	for _, f := range families {
		np.elems[setName(setClusterCIDRs, f)] = cidrElems(prefixesOf(n.ClusterCIDRs, f))
		np.elems[setName(setServiceCIDRs, f)] = cidrElems(prefixesOf(n.ServiceCIDRs, f))
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
	pp := &portPlan{key: k, elems: map[string][]elem{}}
	useLocal := (sp.ClusterIP.IsValid() && sp.InternalLocal) || sp.ExternalLocal
	useCluster := (sp.ClusterIP.IsValid() && !sp.InternalLocal) || sp.External()
	if sp.ClusterIP.IsValid() {
		pp.chains = append(pp.chains, chainPlan{name: chainInternal(k), rules: p.internalRules(sp, n)})
	}
	if sp.External() {
		pp.chains = append(pp.chains, chainPlan{name: chainExternal(k), rules: p.externalRules(sp, n)})
	}
	for _, lb := range []struct {
		use      bool
		local    bool
		backends []servicelb.Backend
	}{{useCluster, false, sp.Cluster}, {useLocal, true, sp.Local}} {
		if !lb.use {
			continue
		}
		if err := p.lb(pp, sp, slotKey{port: k, local: lb.local}, lb.backends, slots); err != nil {
			return nil, err
		}
	}
	p.entries(pp, sp, n)
	for _, b := range sp.Backends() {
		pp.hairpin = append(pp.hairpin, b.Addr)
	}
	slices.SortFunc(pp.hairpin, netip.Addr.Compare)
	pp.hairpin = slices.Compact(pp.hairpin)
	return pp, nil
}

func (p *planner) internalRules(sp *servicelb.ServicePort, n *servicelb.NodeConfig) []rule {
	var rs []rule
	f := sp.Family
	switch {
	case n.MasqueradeAll:
		rs = append(rs, mk(jump(chainMarkMasq)))
	case len(prefixesOf(n.ClusterCIDRs, f)) > 0:
		rs = append(rs, mk(inSet(f, true, true, setName(setClusterCIDRs, f)), jump(chainMarkMasq)))
	}
	lb := chainCluster(sp.Key)
	if sp.InternalLocal {
		lb = chainLocal(sp.Key)
	}
	return append(rs, mk(goTo(lb)))
}

// externalRules send node port, external IP and load-balancer traffic to
// its endpoints. Under the Local policy the client's address is kept, but
// traffic from pods and from the node itself takes the cluster-wide
// endpoints, as kube-proxy does.
func (p *planner) externalRules(sp *servicelb.ServicePort, n *servicelb.NodeConfig) []rule {
	k := sp.Key
	if !sp.ExternalLocal {
		return []rule{mk(jump(chainMarkMasq)), mk(goTo(chainCluster(k)))}
	}
	var rs []rule
	f := sp.Family
	if len(prefixesOf(n.ClusterCIDRs, f)) > 0 {
		rs = append(rs, mk(inSet(f, true, false, setName(setClusterCIDRs, f)), goTo(chainCluster(k))))
	}
	return append(rs,
		mk(fibLocalSource(), jump(chainMarkMasq)),
		mk(fibLocalSource(), goTo(chainCluster(k))),
		mk(goTo(chainLocal(k))))
}

// lb plans a load-balancing chain over bs. Without affinity its one rule
// reads the slot's ranges in a backends map; with affinity it holds a rule
// per endpoint, since a pinned client must find its own endpoint.
func (p *planner) lb(pp *portPlan, sp *servicelb.ServicePort, key slotKey, bs []servicelb.Backend, slots *slotTxn) error {
	slot, err := slots.get(key)
	if err != nil {
		return err
	}
	pp.slots = append(pp.slots, key)
	f, proto := sp.Family, sp.Port.Protocol
	ch := chainPlan{name: key.chain()}
	if sp.Affinity > 0 {
		ch.rules = affinityRules(f, proto, setName(setAffinity, f), slot, bs, sp.Affinity)
	} else {
		set := backendsSet(f, slot)
		pp.shards = append(pp.shards, set)
		ch.rules = []rule{mk(l4proto(proto), dnatMap(f, slot*bucketStride, set))}
		if len(bs) > 0 {
			counts := bucketCounts(bs)
			if counts == nil {
				return fmt.Errorf("nftables: %s: %d endpoints: %w: at most %d endpoints per service port", sp.Key, len(bs), ErrCapacity, buckets)
			}
			pp.elems[set] = append(pp.elems[set], backendElems(slot, bs, counts)...)
		}
	}
	ch.rules = append(ch.rules, mk(drop()))
	pp.chains = append(pp.chains, ch)
	return nil
}

func affinityRules(f servicelb.Family, proto servicelb.Protocol, set string, slot uint32, bs []servicelb.Backend, to time.Duration) []rule {
	var rs []rule
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
		pick := mk(affinityUpdate(f, set, slot, ep, to), l4proto(proto), dnatTo(f, b.AddrPort()))
		if i < len(bs)-1 {
			pick = mk(randomBelow(remaining, uint32(b.Weight)), affinityUpdate(f, set, slot, ep, to), l4proto(proto), dnatTo(f, b.AddrPort()))
		}
		rs = append(rs, pick)
		remaining -= uint32(b.Weight)
	}
	return rs
}

// entries plans the port's elements in the dispatch, reject and firewall
// sets.
func (p *planner) entries(pp *portPlan, sp *servicelb.ServicePort, n *servicelb.NodeConfig) {
	f, k, proto, port := sp.Family, sp.Key, sp.Port.Protocol, sp.Port.Port
	var ents, rejects []elem
	add := func(a netip.Addr, port uint16, chain string) {
		ents = append(ents, vmapElem(a, proto, port, chain))
		rejects = append(rejects, entryElem(a, proto, port))
	}
	if sp.ClusterIP.IsValid() {
		add(sp.ClusterIP, port, chainInternal(k))
	}
	for _, a := range slices.Concat(sp.ExternalIPs, sp.LoadBalancerIPs) {
		add(a, port, chainExternal(k))
	}
	for _, a := range sp.NodeIPs {
		add(a, sp.Port.NodePort, chainExternal(k))
	}
	pp.elems[setName(setServices, f)] = ents
	if !sp.HasBackends() {
		pp.elems[setName(setNoEndpoints, f)] = rejects
	}
	if len(sp.SourceRanges) == 0 || len(sp.LoadBalancerIPs) == 0 {
		return
	}
	allowed := disjoint(slices.Concat(sp.SourceRanges, hostPrefixes(n.IPs(f))))
	for _, a := range sp.LoadBalancerIPs {
		pp.elems[setName(setFirewall, f)] = append(pp.elems[setName(setFirewall, f)], entryElem(a, proto, port))
		for _, src := range allowed {
			pp.elems[setName(setFirewallPass, f)] = append(pp.elems[setName(setFirewallPass, f)], firewallElem(a, proto, port, src))
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
