//go:build linux

package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"
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
	// elems holds the port's elements by set, but for its slots' ranges in
	// the backends maps (backends), made from the port's backends when a
	// diff or a verify needs them. Elements that several ports may need
	// (refs) are kept apart and counted by the model.
	elems    []setElems
	backends []slotRange
	refs     []ref
	slots    []slotKey
	// shards are the backends maps the port's rules read.
	shards []setID
}

// slotRange is a load-balancing slot's range in a backends map, kept as
// the backends it spreads over (the ServicePort's own slice): those of
// the port's local set when local, else of its cluster set.
type slotRange struct {
	set   setID
	slot  uint32
	local bool
	bs    []servicelb.Backend
}

// setElems are a port's elements in one set. A port has elements in few
// sets: a list of them takes much less room than a map.
type setElems struct {
	set setID
	es  []elem
}

// add appends es to the port's elements in set.
func (pp *portPlan) add(set setID, es ...elem) {
	for i := range pp.elems {
		if pp.elems[i].set == set {
			pp.elems[i].es = append(pp.elems[i].es, es...)
			return
		}
	}
	pp.elems = append(pp.elems, setElems{set: set, es: es})
}

// allElems returns the port's elements by set, its slots' ranges with
// them.
func (pp *portPlan) allElems() map[setID][]elem {
	out := make(map[setID][]elem, len(pp.elems)+len(pp.backends))
	for _, x := range pp.elems {
		out[x.set] = x.es
	}
	for _, r := range pp.backends {
		es := backendElems(r.slot, r.bs, bucketCounts(r.bs))
		if prev := out[r.set]; prev != nil {
			es = append(slices.Clip(prev), es...)
		}
		out[r.set] = es
	}
	return out
}

// ref is an element that several service ports may need: a cluster IP
// (several ports share one) or a hairpin pair (several services share an
// endpoint). The table holds it while any port needs it.
type ref struct {
	set  setID
	addr netip.Addr
}

func (r ref) elem() elem {
	if r.set.kind() == kindHairpin {
		return hairpinElem(r.addr)
	}
	return elem{key: r.addr.AsSlice()}
}

func compareRefs(a, b ref) int { return cmp.Or(cmp.Compare(a.set, b.set), a.addr.Compare(b.addr)) }

// planner builds plans for one table. The rules every port shares are made
// (and encoded) once.
type planner struct {
	table        string
	affinitySize uint32
	caps         servicelb.Capabilities
	drop         *rule
	// origins holds the rules the entry chains share, by family and way
	// of recognising pods: made once for each that a node asks for.
	mu      sync.Mutex
	origins map[originKey]*originRules
}

type originKey struct {
	f    servicelb.Family
	pods pods
}

// origins is the number of servicelb.Origins.
const origins = len(servicelb.Verdicts{})

func newPlanner(table string, affinitySize uint32) *planner {
	return &planner{table: table, affinitySize: affinitySize, caps: capabilities(), drop: mk(drop()),
		origins: map[originKey]*originRules{}}
}

// originRules returns the shared rules of the entry chains of family f on
// node n. Planning is safe for concurrent use (Render runs beside Sync).
func (p *planner) originRules(n *servicelb.NodeConfig, f servicelb.Family) *originRules {
	k := originKey{f, podsOf(n, f)}
	p.mu.Lock()
	defer p.mu.Unlock()
	o := p.origins[k]
	if o == nil {
		o = newOriginRules(f, k.pods)
		p.origins[k] = o
	}
	return o
}

func baseChain(name string, hook uint32, prio int32, rules ...*rule) chainPlan {
	accept := nfnl.VerdictAccept
	return chainPlan{name: name, hook: &nfnl.Hook{Num: hook, Priority: prio, Type: "nat", Policy: &accept}, rules: rules}
}

var families = [2]servicelb.Family{servicelb.IPv4, servicelb.IPv6}

// node plans the node-wide chains and elements, after checking that the
// table can express the node.
func (p *planner) node(n *servicelb.NodeConfig) (nodePlan, error) {
	if err := p.caps.CheckNode(n); err != nil {
		return nodePlan{}, err
	}
	m := n.MasqueradeMark()
	var masq []*rule
	for _, f := range families {
		masq = append(masq, mk(ctDNAT(), hairpinIn(f, fixedSet(kindHairpin, f).name()), masquerade()))
	}
	masq = append(masq, mk(markClear(m), returnVerdict()), mk(markSetXor(m)), mk(masquerade()))
	np := nodePlan{
		chains: []chainPlan{
			baseChain(chainNatPrerouting, nfnl.HookPrerouting, -100, mk(jump(chainServices))),
			baseChain(chainNatOutput, nfnl.HookOutput, -100, mk(jump(chainServices))),
			baseChain(chainNatPostrouting, nfnl.HookPostrouting, 100, mk(jump(chainMasquerading))),
			{name: chainMarkMasq, rules: []*rule{mk(markSetOr(m))}},
			{name: chainMasquerading, rules: masq},
			{name: chainServices, rules: servicesRules()},
		},
		elems: map[setID][]elem{},
	}
	for _, f := range families {
		np.elems[fixedSet(kindPodCIDRs, f)] = cidrElems(n.LocalMatch(f).CIDRs)
		np.elems[fixedSet(kindServiceCIDRs, f)] = cidrElems(n.DroppedServiceCIDRs(f))
	}
	return np, nil
}

// servicesRules dispatch new flows: a load-balancer IP drops the sources
// outside its ranges; every frontend goes to its port's chain; what
// remains is rejected when it is for a cluster IP (a port no service
// has), and dropped when it is for another address of the service CIDRs.
func servicesRules() []*rule {
	var svc []*rule
	for _, f := range families {
		svc = append(svc, mk(entryIn(f, fixedSet(kindFirewall, f).name()), entrySourceNotIn(f, fixedSet(kindFirewallPass, f).name()), drop()))
	}
	for _, f := range families {
		svc = append(svc, mk(entryVmap(f, fixedSet(kindServices, f).name())))
	}
	for _, f := range families {
		svc = append(svc, mk(inSet(f, false, false, fixedSet(kindClusterIPs, f).name()), reject(f)))
	}
	for _, f := range families {
		svc = append(svc, mk(inSet(f, false, false, fixedSet(kindServiceCIDRs, f).name()), drop()))
	}
	return svc
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
	if err := p.caps.CheckPort(sp); err != nil {
		return nil, err
	}
	k := sp.Key
	pp := &portPlan{key: k}
	origins := p.originRules(n, sp.Family)
	var kinds []entryChain
	if sp.ClusterIP.IsValid() {
		kinds = append(kinds, entryChain{chainInternal(k), sp.Internal})
	}
	if sp.ExternallyAccessible() {
		kinds = append(kinds, entryChain{chainExternal(k), sp.External})
	}
	lbs, err := p.balancers(pp, sp, kinds, origins.pods.detects(), slots)
	if err != nil {
		return nil, err
	}
	chains := make([]chainPlan, 0, len(kinds)+len(pp.chains))
	for _, c := range kinds {
		chains = append(chains, chainPlan{name: c.name, rules: p.entryRules(origins, c.verdicts, lbs)})
	}
	pp.chains = append(chains, pp.chains...)
	entries(pp, sp)
	pp.refs = refsOf(sp)
	return pp, nil
}

// endpoints plans a port whose change touches its endpoints alone
// (servicelb.PortChange.EndpointsOnly) from its plan before: its chains
// and its elements in the dispatch and firewall sets stay as they were
// (the same values, shared), its slots keep their keys, and only the
// ranges of its slots and its hairpin elements follow the endpoints. It
// reports false for a port with affinity, whose chains hold its
// endpoints: that one is planned whole.
func (p *planner) endpoints(old *portPlan, sp *servicelb.ServicePort, slots *slotTxn) (*portPlan, bool, error) {
	if sp.Affinity > 0 {
		return nil, false, nil
	}
	if err := p.caps.CheckPort(sp); err != nil {
		return nil, false, err
	}
	pp := &portPlan{key: old.key, chains: old.chains, elems: old.elems, slots: old.slots, shards: old.shards, refs: refsOf(sp)}
	for _, k := range old.slots {
		bs := sp.Targets(servicelb.Verdict{Action: servicelb.ToCluster})
		if k.local {
			bs = sp.Targets(servicelb.Verdict{Action: servicelb.ToLocal})
		}
		if len(bs) == 0 {
			continue
		}
		slot, err := slots.get(k)
		if err != nil {
			return nil, false, err
		}
		pp.backends = append(pp.backends, slotRange{set: shardSet(sp.Family, slot), slot: slot, local: k.local, bs: bs})
	}
	return pp, true, nil
}

// entryChain is the chain of one kind of frontend (the cluster IP, or
// the external ones) and the verdicts it renders.
type entryChain struct {
	name     string
	verdicts servicelb.Verdicts
}

// refsOf returns the shared elements a port needs: its cluster IP, and
// the hairpin pairs of the endpoints its verdicts may forward to.
// They come sorted (compareRefs): the cluster IP's set before the
// hairpin set, and the hairpin addresses as sorted as ServicePort.Hairpin.
func refsOf(sp *servicelb.ServicePort) []ref {
	out := make([]ref, 0, 1+len(sp.Hairpin))
	if sp.ClusterIP.IsValid() {
		out = append(out, ref{fixedSet(kindClusterIPs, sp.Family), sp.ClusterIP})
	}
	for _, a := range sp.Hairpin {
		out = append(out, ref{fixedSet(kindHairpin, servicelb.FamilyOf(a)), a})
	}
	return out
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
		return mkOwn(append(match, goTo(b.chain))...)
	}
	return mkOwn(append(match, b.dnat...)...)
}

// balancers plans the load balancing over the endpoint sets that the
// chains' verdicts forward to: the cluster set, then the local set. Both
// chains of a port share them.
func (p *planner) balancers(pp *portPlan, sp *servicelb.ServicePort, kinds []entryChain, pods bool, slots *slotTxn) (map[servicelb.Action]balancer, error) {
	used := map[servicelb.Action]bool{}
	for _, c := range kinds {
		for _, o := range routes(c.verdicts, pods) {
			used[c.verdicts[o].Action] = true
		}
	}
	lbs := make(map[servicelb.Action]balancer, 2)
	for _, a := range []servicelb.Action{servicelb.ToCluster, servicelb.ToLocal} {
		if !used[a] {
			continue
		}
		b, err := p.lb(pp, sp, slotKey{port: sp.Key, local: a == servicelb.ToLocal}, sp.Targets(servicelb.Verdict{Action: a}), slots)
		if err != nil {
			return nil, err
		}
		lbs[a] = b
	}
	return lbs, nil
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
		rules, eps := affinityRules(f, proto, fixedSet(kindAffinity, f).name(), key.chain(), slot, bs, sp.Affinity)
		pp.chains = append(pp.chains, chainPlan{name: key.chain(), rules: append(rules, p.drop)})
		pp.chains = append(pp.chains, eps...)
		return balancer{chain: key.chain()}, nil
	}
	set := shardSet(f, slot)
	pp.shards = append(pp.shards, set)
	if len(bs) > 0 {
		if bucketCounts(bs) == nil {
			// Capabilities.CheckPort refuses such a port first.
			return balancer{}, capacityError(sp.Key, "endpoints", fmt.Sprintf("%d endpoints in one set, at most %d", len(bs), buckets))
		}
		pp.backends = append(pp.backends, slotRange{set: set, slot: slot, local: key.local, bs: bs})
	}
	return balancer{dnat: []term{l4proto(proto), dnatMap(f, slot*bucketStride, set.name())}}, nil
}

// capacityError refuses a service port the table has no room for.
func capacityError(k servicelb.ServicePortKey, field, why string) error {
	return &servicelb.ValidationError{Service: k.Service, Field: field,
		Err: fmt.Errorf("%w: the nftables backend: %s: %s", servicelb.ErrCapacity, k, why)}
}

// affinityRules balance an affinity port: a client pinned to an endpoint
// goes to that endpoint's chain; another picks an endpoint at random, in
// proportion to the weights (each rule takes its endpoint with probability
// weight / remaining weight), and goes to its chain. An endpoint's chain
// pins the client (or refreshes the pin) in one rule and translates in the
// next, so that a full affinity set loses the pin and never the
// connection: an update that fails ends only its own rule.
func affinityRules(f servicelb.Family, proto servicelb.Protocol, set, chain string, slot uint32, bs []servicelb.Backend, to time.Duration) ([]*rule, []chainPlan) {
	rs := make([]*rule, 0, 2*len(bs))
	eps := make([]chainPlan, len(bs))
	for i, b := range bs {
		ep := endpointID(b.AddrPort())
		eps[i] = chainPlan{name: fmt.Sprintf("%s/%d", chain, i), rules: []*rule{
			mkOwn(affinityUpdate(f, set, slot, ep, to)),
			mkOwn(l4proto(proto), dnatTo(f, b.AddrPort())),
		}}
		rs = append(rs, mkOwn(affinityHit(f, set, slot, ep), goTo(eps[i].name)))
	}
	var remaining uint32
	for _, b := range bs {
		remaining += uint32(b.Weight)
	}
	for i, b := range bs {
		terms := []term{goTo(eps[i].name)}
		if i < len(bs)-1 {
			terms = append([]term{randomBelow(remaining, uint32(b.Weight))}, terms...)
		}
		rs = append(rs, mkOwn(terms...))
		remaining -= uint32(b.Weight)
	}
	return rs, eps
}

// entries plans the port's elements in the dispatch map and the
// firewall sets.
func entries(pp *portPlan, sp *servicelb.ServicePort) {
	f, k, proto, port := sp.Family, sp.Key, sp.Port.Protocol, sp.Port.Port
	ents := make([]elem, 0, len(sp.ExternalIPs)+len(sp.LoadBalancerIPs)+len(sp.NodeIPs)+1)
	add := func(a netip.Addr, port uint16, chain string) {
		ents = append(ents, elem{key: entryBytes(a, proto, port), chain: chain})
	}
	if sp.ClusterIP.IsValid() {
		add(sp.ClusterIP, port, chainInternal(k))
	}
	if sp.ExternallyAccessible() {
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
	pp.add(fixedSet(kindServices, f), ents...)
	firewall(pp, sp)
}

// firewall plans the source ranges of the port's load-balancer IPs. They
// matter only when a verdict forwards external traffic: a port that drops
// or rejects it does so whatever the source.
func firewall(pp *portPlan, sp *servicelb.ServicePort) {
	if len(sp.SourceRanges) == 0 || len(sp.LoadBalancerIPs) == 0 || !forwards(sp.External) {
		return
	}
	f, proto, port := sp.Family, sp.Port.Protocol, sp.Port.Port
	fw, pass := fixedSet(kindFirewall, f), fixedSet(kindFirewallPass, f)
	for _, a := range sp.LoadBalancerIPs {
		pp.add(fw, elem{key: entryBytes(a, proto, port)})
		for _, src := range sp.SourceRanges {
			pp.add(pass, firewallElem(a, proto, port, src))
		}
	}
}

func forwards(vs servicelb.Verdicts) bool {
	return slices.ContainsFunc(vs[:], func(v servicelb.Verdict) bool { return v.Action.Forwards() })
}
