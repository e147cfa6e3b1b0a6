//go:build linux

package nftables

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
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
// The model keeps a port as its ServicePort and the slots of its
// balancers (portPlan) and makes its fragment again when a diff, a verify
// or a write needs it, so that it holds almost nothing the State does not.

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

// portPlan is one service port as the model keeps it: the ServicePort it
// renders and the load-balancing slots it holds, over its cluster set
// (index 0) and its local set (1) where uses says so.
type portPlan struct {
	sp   *servicelb.ServicePort
	slot [2]uint32
	uses [2]bool
}

// slotKey returns the key of the port's slot i.
func (pp *portPlan) slotKey(i int) slotKey { return slotKey{port: pp.sp.Key, local: i == 1} }

// eachShard calls f for each backends map the port's rules read: one per
// slot of a port without affinity.
func (pp *portPlan) eachShard(f func(setID)) {
	if pp.sp.Affinity > 0 {
		return
	}
	for i := range pp.uses {
		if pp.uses[i] {
			f(shardSet(pp.sp.Family, pp.slot[i]))
		}
	}
}

// fragment is a port's chains and elements: its elements by set, but for
// its slots' ranges in the backends maps (backends), which stay the
// ServicePort's backends until elements of them are needed.
type fragment struct {
	chains   []chainPlan
	elems    []setElems
	backends []slotRange
}

// slotRange is a load-balancing slot's range in a backends map, kept as
// the backends it spreads over (the ServicePort's own slice).
type slotRange struct {
	set  setID
	slot uint32
	bs   []servicelb.Backend
}

// setElems are a port's elements in one set. A port has elements in few
// sets: a list of them takes much less room than a map.
type setElems struct {
	set setID
	es  []elem
}

// add appends es to the fragment's elements in set.
func (fr *fragment) add(set setID, es ...elem) {
	for i := range fr.elems {
		if fr.elems[i].set == set {
			fr.elems[i].es = append(fr.elems[i].es, es...)
			return
		}
	}
	fr.elems = append(fr.elems, setElems{set: set, es: es})
}

// allElems returns the fragment's elements by set, its slots' ranges
// with them.
func (fr *fragment) allElems() map[setID][]elem {
	out := make(map[setID][]elem, len(fr.elems)+len(fr.backends))
	for _, x := range fr.elems {
		out[x.set] = x.es
	}
	for _, r := range fr.backends {
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

// refKey is a ref as the model counts it: the address in 16 bytes (an
// IPv4 address mapped), which takes less room than a netip.Addr.
type refKey struct {
	set setID
	a   [16]byte
}

func (r ref) key() refKey { return refKey{r.set, r.addr.As16()} }

func (k refKey) ref() ref { return ref{k.set, netip.AddrFrom16(k.a).Unmap()} }

func compareRefKeys(a, b refKey) int {
	return cmp.Or(cmp.Compare(a.set, b.set), bytes.Compare(a.a[:], b.a[:]))
}

// slotRanges returns the ranges of a port without affinity in its slots.
func slotRanges(pp *portPlan) []slotRange {
	var out []slotRange
	for i := range pp.uses {
		if bs := targets(pp.sp, i); pp.uses[i] && len(bs) > 0 {
			out = append(out, slotRange{set: shardSet(pp.sp.Family, pp.slot[i]), slot: pp.slot[i], bs: bs})
		}
	}
	return out
}

// planner builds plans for one table. The rules every port shares are made
// (and encoded) once.
type planner struct {
	table        string
	affinitySize uint32
	caps         servicelb.Capabilities
	drop         *rule
	// origins holds the rules the entry chains share, by family and way
	// of recognising pods: made once for each that a node asks for.
	// protos and tails hold, encoded, the terms every load-balancing rule
	// of a protocol, or of a backends map, shares; ng encodes the draws.
	mu      sync.Mutex
	origins map[originKey]*originRules
	protos  map[servicelb.Protocol]term
	tails   map[setID]term
	ng      *numgenCode
	// podsNode and podsOf are the last node whose pods were asked for
	// (podsOf reads every CIDR of the node), and its answer per family.
	podsNode *servicelb.NodeConfig
	podsAns  [2]pods
}

// pods returns how node n recognises its pods in family f (podsOf),
// read once for the node a run of ports is planned for. n must not change
// once planned for, as a model's and a step's node does not.
func (p *planner) pods(n *servicelb.NodeConfig, f servicelb.Family) pods {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.podsNode != n {
		p.podsNode, p.podsAns = n, [2]pods{podsOf(n, servicelb.IPv4), podsOf(n, servicelb.IPv6)}
	}
	return p.podsAns[famIndex(f)]
}

type originKey struct {
	f    servicelb.Family
	pods pods
}

// origins is the number of servicelb.Origins.
const origins = len(servicelb.Verdicts{})

func newPlanner(table string, affinitySize uint32) *planner {
	return &planner{table: table, affinitySize: affinitySize, caps: capabilities(), drop: mk(drop()),
		origins: map[originKey]*originRules{}, protos: map[servicelb.Protocol]term{}, tails: map[setID]term{},
		ng: newNumgenCode()}
}

// l4proto returns "meta l4proto p", encoded once.
func (p *planner) l4proto(proto servicelb.Protocol) term {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.protos[proto]
	if !ok {
		t = encoded(l4proto(proto))
		p.protos[proto] = t
	}
	return t
}

// tail returns dnatTail of a backends map, encoded once, with the map's
// name for text.
func (p *planner) tail(set setID) term {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tails[set]
	if !ok {
		t = dnatTail(set.family(), set.name())
		t.text = set.name()
		p.tails[set] = t
	}
	return t
}

// originRules returns the shared rules of the entry chains of family f on
// node n. Planning is safe for concurrent use (Render runs beside Sync).
func (p *planner) originRules(n *servicelb.NodeConfig, f servicelb.Family) *originRules {
	k := originKey{f, p.pods(n, f)}
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

// port plans one service port: checks that the table can hold it and
// gives its balancers their slots. Those it held in old (nil for a new
// port) it keeps; others it takes from slots, whose assignment the caller
// commits or drops with the sync. The caller releases the slots of old
// that the port no longer holds.
func (p *planner) port(sp *servicelb.ServicePort, n *servicelb.NodeConfig, slots *slotTxn, old *portPlan) (portPlan, error) {
	if err := p.caps.CheckPort(sp); err != nil {
		return portPlan{}, err
	}
	pp := portPlan{sp: sp}
	pp.uses = balanced(sp, p.pods(n, sp.Family).detects())
	for i, used := range pp.uses {
		if !used {
			continue
		}
		if sp.Affinity == 0 && len(targets(sp, i)) > buckets {
			// Capabilities.CheckPort refuses such a port first.
			return portPlan{}, capacityError(sp.Key, "endpoints", fmt.Sprintf("%d endpoints in one set, at most %d", len(targets(sp, i)), buckets))
		}
		if old != nil && old.uses[i] {
			pp.slot[i] = old.slot[i]
			continue
		}
		slot, err := slots.get(pp.slotKey(i))
		if err != nil {
			return portPlan{}, err
		}
		pp.slot[i] = slot
	}
	return pp, nil
}

// balanced reports which sets of endpoints the port's verdicts forward
// to: the cluster set (index 0), the local set (1). pods says whether the
// node recognises any flow as a pod's.
func balanced(sp *servicelb.ServicePort, pods bool) [2]bool {
	var out [2]bool
	var vs [2]servicelb.Verdicts
	n := 0
	if sp.ClusterIP.IsValid() {
		vs[n], n = sp.Internal, n+1
	}
	if sp.ExternallyAccessible() {
		vs[n], n = sp.External, n+1
	}
	for _, v := range vs[:n] {
		for _, o := range routes(v, pods) {
			switch v[o].Action {
			case servicelb.ToCluster:
				out[0] = true
			case servicelb.ToLocal:
				out[1] = true
			}
		}
	}
	return out
}

// targets returns the endpoints of the port's set i: cluster (0), local (1).
func targets(sp *servicelb.ServicePort, i int) []servicelb.Backend {
	if i == 1 {
		return sp.Local
	}
	return sp.Cluster
}

// entryChain is the chain of one kind of frontend (the cluster IP, or
// the external ones) and the verdicts it renders.
type entryChain struct {
	name     string
	verdicts servicelb.Verdicts
}

// entryKinds returns the port's entry chains, the first n of kinds: its
// cluster IP's, its external frontends'.
func entryKinds(sp *servicelb.ServicePort) (kinds [2]entryChain, n int) {
	if sp.ClusterIP.IsValid() {
		kinds[n] = entryChain{chainInternal(sp.Key), sp.Internal}
		n++
	}
	if sp.ExternallyAccessible() {
		kinds[n] = entryChain{chainExternal(sp.Key), sp.External}
		n++
	}
	return kinds, n
}

// fragment makes a planned port's chains and elements for node n.
func (p *planner) fragment(pp *portPlan, n *servicelb.NodeConfig) *fragment {
	sp := pp.sp
	fr := &fragment{}
	origins := p.originRules(n, sp.Family)
	all, nk := entryKinds(sp)
	kinds := all[:nk]
	fr.chains = make([]chainPlan, len(kinds), len(kinds)+1)
	var lbs [2]balancer
	for i, used := range pp.uses {
		if used {
			lbs[i] = p.lb(fr, sp, pp.slotKey(i), pp.slot[i], targets(sp, i))
		}
	}
	for i, c := range kinds {
		fr.chains[i] = chainPlan{name: c.name, rules: p.entryRules(origins, c.verdicts, &lbs)}
	}
	entries(fr, sp, kinds)
	return fr
}

// eachRef calls f with each shared element a port needs, in order
// (compareRefs): its cluster IP, then the hairpin pairs of the endpoints
// its verdicts may forward to, as sorted as ServicePort.Hairpin.
func eachRef(sp *servicelb.ServicePort, f func(ref)) {
	if sp.ClusterIP.IsValid() {
		f(ref{fixedSet(kindClusterIPs, sp.Family), sp.ClusterIP})
	}
	for _, a := range sp.Hairpin {
		f(ref{fixedSet(kindHairpin, servicelb.FamilyOf(a)), a})
	}
}

// refsOf returns the shared elements a port needs, in eachRef's order.
func refsOf(sp *servicelb.ServicePort) []ref {
	out := make([]ref, 0, 1+len(sp.Hairpin))
	eachRef(sp, func(r ref) { out = append(out, r) })
	return out
}

// chainNames calls f with the name of each chain of a planned port, as
// its fragment makes them.
func chainNames(pp *portPlan, f func(name string)) {
	kinds, n := entryKinds(pp.sp)
	for _, c := range kinds[:n] {
		f(c.name)
	}
	if pp.sp.Affinity == 0 {
		return
	}
	for i := range pp.uses {
		if pp.uses[i] {
			chain := pp.slotKey(i).chain()
			f(chain)
			for j := range targets(pp.sp, i) {
				f(endpointChain(chain, j))
			}
		}
	}
}

// endpointChain names the chain of endpoint i of an affinity port's
// balancing chain.
func endpointChain(chain string, i int) string { return chain + "/" + strconv.Itoa(i) }

// balancer spreads a port's traffic over one set of endpoints: with a rule
// that translates at once (dnat terms), or through the chain that holds an
// affinity port's rules.
type balancer struct {
	chain string
	dnat  []term
}

// rule matches the terms, then balances.
func (b balancer) rule(match ...term) *rule {
	terms := make([]term, 0, len(match)+len(b.dnat)+1)
	terms = append(terms, match...)
	if b.chain != "" {
		return mkOwn(append(terms, goTo(b.chain))...)
	}
	return mkOwn(append(terms, b.dnat...)...)
}

// lb plans the load balancing over bs in the slot. Without affinity it is
// one rule term that reads the slot's ranges in a backends map, written
// into the chains that use it; with affinity it is a chain of its own with
// a rule per endpoint, since a pinned client must find its own endpoint.
func (p *planner) lb(fr *fragment, sp *servicelb.ServicePort, key slotKey, slot uint32, bs []servicelb.Backend) balancer {
	f, proto := sp.Family, sp.Port.Protocol
	if sp.Affinity > 0 {
		rules, eps := affinityRules(f, proto, fixedSet(kindAffinity, f).name(), key.chain(), slot, bs, sp.Affinity)
		fr.chains = append(fr.chains, chainPlan{name: key.chain(), rules: append(rules, p.drop)})
		fr.chains = append(fr.chains, eps...)
		return balancer{chain: key.chain()}
	}
	set := shardSet(f, slot)
	if len(bs) > 0 {
		fr.backends = append(fr.backends, slotRange{set: set, slot: slot, bs: bs})
	}
	tail := p.tail(set)
	return balancer{dnat: []term{p.l4proto(proto), dnatMap(f, slot*bucketStride, tail.text, p.ng, tail)}}
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
		eps[i] = chainPlan{name: endpointChain(chain, i), rules: []*rule{
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
// firewall sets; kinds are the port's entry chains (entryKinds).
func entries(fr *fragment, sp *servicelb.ServicePort, kinds []entryChain) {
	f, proto, port := sp.Family, sp.Port.Protocol, sp.Port.Port
	ents := make([]elem, 0, len(sp.ExternalIPs)+len(sp.LoadBalancerIPs)+len(sp.NodeIPs)+1)
	add := func(a netip.Addr, port uint16, chain string) {
		ents = append(ents, elem{key: entryBytes(a, proto, port), chain: chain})
	}
	if sp.ClusterIP.IsValid() {
		add(sp.ClusterIP, port, kinds[0].name)
	}
	if sp.ExternallyAccessible() {
		ext := kinds[len(kinds)-1].name
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
	fr.add(fixedSet(kindServices, f), ents...)
	firewall(fr, sp)
}

// firewall plans the source ranges of the port's load-balancer IPs. They
// matter only when a verdict forwards external traffic: a port that drops
// or rejects it does so whatever the source.
func firewall(fr *fragment, sp *servicelb.ServicePort) {
	if len(sp.SourceRanges) == 0 || len(sp.LoadBalancerIPs) == 0 || !forwards(sp.External) {
		return
	}
	f, proto, port := sp.Family, sp.Port.Protocol, sp.Port.Port
	fw, pass := fixedSet(kindFirewall, f), fixedSet(kindFirewallPass, f)
	for _, a := range sp.LoadBalancerIPs {
		fr.add(fw, elem{key: entryBytes(a, proto, port)})
		for _, src := range sp.SourceRanges {
			fr.add(pass, firewallElem(a, proto, port, src))
		}
	}
}

func forwards(vs servicelb.Verdicts) bool {
	return slices.ContainsFunc(vs[:], func(v servicelb.Verdict) bool { return v.Action.Forwards() })
}
