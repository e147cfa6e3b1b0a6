//go:build linux

package nftables

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
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
// A port without affinity has no chain of its own: its fragment is
// elements alone (its frontends in the sets of their verdict shape and of
// their number of buckets, and its endpoints in the endpoints map), and the
// chains it goes through are shared by every port of the same shape. The
// model keeps a port as its ServicePort, the slots of an affinity port's
// balancers and the shared sets it is in (portPlan), and makes its
// fragment again when a diff, a verify or a write needs it, so that it
// holds almost nothing the State does not.

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
// renders; for a port with affinity, the slots its balancers hold over its
// cluster set (index 0) and its local set (1) where uses says so; for a
// port without, the shape and bucket sets its frontends are in (shared),
// in ascending order.
type portPlan struct {
	sp     *servicelb.ServicePort
	slot   [2]uint32
	uses   [2]bool
	shared []setID
}

// slotKey returns the key of the port's slot i.
func (pp *portPlan) slotKey(i int) slotKey { return slotKey{port: pp.sp.Key, local: i == 1} }

// fragment is a port's chains and its elements by set.
type fragment struct {
	chains []chainPlan
	elems  []setElems
}

// setElems are a port's elements in one set. A port has elements in few
// sets: a list of them takes much less room than a map.
type setElems struct {
	set setID
	es  []elem
}

// add appends es to the fragment's elements in set.
func (fr *fragment) add(set setID, es ...elem) {
	if len(es) == 0 {
		return
	}
	for i := range fr.elems {
		if fr.elems[i].set == set {
			fr.elems[i].es = append(fr.elems[i].es, es...)
			return
		}
	}
	fr.elems = append(fr.elems, setElems{set: set, es: es})
}

// allElems returns the fragment's elements by set.
func (fr *fragment) allElems() map[setID][]elem {
	out := make(map[setID][]elem, len(fr.elems))
	for _, x := range fr.elems {
		out[x.set] = x.es
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
		origins: map[originKey]*originRules{}}
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
		},
		elems: map[setID][]elem{},
	}
	for _, f := range families {
		np.elems[fixedSet(kindPodCIDRs, f)] = cidrElems(n.LocalMatch(f).CIDRs)
		np.elems[fixedSet(kindServiceCIDRs, f)] = cidrElems(n.DroppedServiceCIDRs(f))
		np.elems[fixedSet(kindProtocols, f)] = protocolElems()
	}
	return np, nil
}

// protocolElems are the protocols a service port may have, which the
// balancing rules name for nft's sake: it translates a port only after
// a match of the protocol.
func protocolElems() []elem {
	var out []elem
	for _, p := range []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP} {
		out = append(out, elem{key: []byte{p.Number()}})
	}
	return out
}

// shared plans the chains the ports without affinity share, for the shape
// and bucket sets in use (counted in inUse): the services chain, which
// dispatches to the shapes' chains, the chain of each shape, and the
// balancing chains, one rule per bucket set.
func (p *planner) shared(n *servicelb.NodeConfig, inUse map[setID]int) []chainPlan {
	var shapes []setID
	var spreads [2][2][]setID // by family, then cluster and local
	for _, id := range slices.Sorted(maps.Keys(inUse)) {
		if id.kind() == kindShape {
			shapes = append(shapes, id)
			continue
		}
		_, local := id.buckets()
		fi := famIndex(id.family())
		spreads[fi][boolByte(local)] = append(spreads[fi][boolByte(local)], id)
	}
	chains := []chainPlan{{name: chainServices, rules: servicesRules(shapes)}}
	for _, f := range families {
		for i := range 2 {
			var rs []*rule
			for _, id := range spreads[famIndex(f)][i] {
				rs = append(rs, balanceRule(f, id))
			}
			chains = append(chains, chainPlan{name: chainBalance(f, i == 1), rules: append(rs, p.drop)})
		}
	}
	for _, id := range shapes {
		f := id.family()
		lbs := [2]balancer{{chain: chainBalance(f, false)}, {chain: chainBalance(f, true)}}
		chains = append(chains, chainPlan{name: id.name(), rules: p.entryRules(p.originRules(n, f), id.verdicts(), &lbs)})
	}
	return chains
}

// nodeChains returns the chains of the model that no port owns: the
// node's, and those the ports without affinity share.
func (p *planner) nodeChains(m *model) []chainPlan {
	return append(slices.Clip(m.node.chains), p.shared(m.cfg, m.shared)...)
}

// balanceRule translates the flows of the frontends in a bucket set to
// one of their endpoints, drawn at random:
//
//	ip daddr . meta l4proto . th dport @buckets4/cluster-3 meta l4proto @protocols4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @endpoints4
func balanceRule(f servicelb.Family, id setID) *rule {
	n, local := id.buckets()
	var from uint32
	if local {
		from = bucketStride
	}
	return mk(entryIn(f, id.name()), protoIn(fixedSet(kindProtocols, f).name()), dnatEndpoint(f, n, from, fixedSet(kindEndpoints, f).name()))
}

// servicesRules dispatch new flows: a load-balancer IP drops the sources
// outside its ranges; every frontend goes to the chain of its shape (in
// the set of the shape), or of its port when it has affinity (in the
// services map); what remains is rejected when it is for a cluster IP (a
// port no service has), and dropped when it is for another address of the
// service CIDRs.
func servicesRules(shapes []setID) []*rule {
	var svc []*rule
	for _, f := range families {
		svc = append(svc, mk(entryIn(f, fixedSet(kindFirewall, f).name()), entrySourceNotIn(f, fixedSet(kindFirewallPass, f).name()), drop()))
	}
	for _, id := range shapes {
		svc = append(svc, mk(entryIn(id.family(), id.name()), goTo(id.name())))
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
	pods := p.pods(n, sp.Family).detects()
	pp.uses = balanced(sp, pods)
	for i, used := range pp.uses {
		if used && sp.Affinity == 0 && len(targets(sp, i)) > buckets {
			// Capabilities.CheckPort refuses such a port first.
			return portPlan{}, capacityError(sp.Key, "endpoints", fmt.Sprintf("%d endpoints in one set, at most %d", len(targets(sp, i)), buckets))
		}
	}
	if sp.Affinity == 0 {
		pp.shared = sharedSets(sp, pods)
		return pp, nil
	}
	for i, used := range pp.uses {
		if !used {
			continue
		}
		if old != nil && old.sp.Affinity > 0 && old.uses[i] {
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
	kinds, n := entryKinds(sp)
	for _, c := range kinds[:n] {
		r := routed(c.verdicts, pods)
		out[0], out[1] = out[0] || r[0], out[1] || r[1]
	}
	return out
}

// routed reports which sets of endpoints verdicts vs forward to.
func routed(vs servicelb.Verdicts, pods bool) [2]bool {
	var out [2]bool
	for _, o := range routes(vs, pods) {
		switch vs[o].Action {
		case servicelb.ToCluster:
			out[0] = true
		case servicelb.ToLocal:
			out[1] = true
		}
	}
	return out
}

// sharedSets returns the shape and bucket sets the frontends of a port
// without affinity are in, in ascending order: for each kind of
// frontend, the set of its verdicts' shape, and the bucket set of each
// set of endpoints they forward to, when it has endpoints.
func sharedSets(sp *servicelb.ServicePort, pods bool) []setID {
	var out []setID
	add := func(id setID) {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	spread := spreadOf(sp)
	kinds, n := entryKinds(sp)
	for _, c := range kinds[:n] {
		if frontends(sp, c.external) == 0 {
			continue
		}
		add(shapeSet(sp.Family, c.verdicts))
		for i, to := range routed(c.verdicts, pods) {
			if to && spread[i].n > 0 {
				add(bucketSet(sp.Family, i == 1, spread[i].n))
			}
		}
	}
	slices.Sort(out)
	return out
}

// spread is how one set of a port's endpoints shares its buckets: counts
// per endpoint (bucketCounts), n in all; none for no endpoints.
type spread struct {
	counts []uint32
	n      uint32
}

// spreadOf returns the spreads of a port's cluster set (0) and local set (1).
func spreadOf(sp *servicelb.ServicePort) [2]spread {
	var out [2]spread
	for i := range out {
		if cs := bucketCounts(targets(sp, i)); cs != nil {
			out[i] = spread{counts: cs, n: sum(cs)}
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
	external bool
}

// entryKinds returns the port's entry chains, the first n of kinds: its
// cluster IP's, its external frontends'.
func entryKinds(sp *servicelb.ServicePort) (kinds [2]entryChain, n int) {
	if sp.ClusterIP.IsValid() {
		kinds[n] = entryChain{chainInternal(sp.Key), sp.Internal, false}
		n++
	}
	if sp.ExternallyAccessible() {
		kinds[n] = entryChain{chainExternal(sp.Key), sp.External, true}
		n++
	}
	return kinds, n
}

// fragment makes a planned port's chains and elements for node n.
func (p *planner) fragment(pp *portPlan, n *servicelb.NodeConfig) *fragment {
	fr := &fragment{}
	p.fragmentInto(fr, pp, n, nil)
	return fr
}

// fragmentInto makes a planned port's chains and elements into fr, which
// holds none, taking the memory of the elements of a port without
// affinity from a (nil: its own).
func (p *planner) fragmentInto(fr *fragment, pp *portPlan, n *servicelb.NodeConfig, a *arena) {
	sp := pp.sp
	all, nk := entryKinds(sp)
	kinds := all[:nk]
	if sp.Affinity == 0 {
		p.flatEntries(fr, sp, n, kinds, a)
		firewall(fr, sp)
		return
	}
	origins := p.originRules(n, sp.Family)
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
	firewall(fr, sp)
}

// eachRef calls f with each shared element a port needs, in order
// (compareRefs): its cluster IP, then the hairpin pairs of the endpoints
// its verdicts may forward to, in ServicePort.HairpinAddrs' order.
func eachRef(sp *servicelb.ServicePort, f func(ref)) {
	if sp.ClusterIP.IsValid() {
		f(ref{fixedSet(kindClusterIPs, sp.Family), sp.ClusterIP})
	}
	for a := range sp.HairpinAddrs() {
		f(ref{fixedSet(kindHairpin, sp.Family), a})
	}
}

// refsOf returns the shared elements a port needs, in eachRef's order.
func refsOf(sp *servicelb.ServicePort) []ref {
	out := make([]ref, 0, 1+len(sp.Cluster)+len(sp.Local))
	eachRef(sp, func(r ref) { out = append(out, r) })
	return out
}

// flatEntries plans the elements of a port without affinity: each
// frontend in the set of its kind's shape, and, for each set of endpoints
// its kind forwards to, in the bucket set of the endpoints' spread, with
// its buckets in the endpoints map (the local set's from bucketStride).
// The elements and their bytes come from a.
func (p *planner) flatEntries(fr *fragment, sp *servicelb.ServicePort, n *servicelb.NodeConfig, kinds []entryChain, a *arena) {
	f := sp.Family
	al := addrLen(f)
	pods := p.pods(n, f).detects()
	spread := spreadOf(sp)
	var owners [2][]int32
	a.reuseScratch()
	for _, c := range kinds {
		nf := frontends(sp, c.external)
		if nf == 0 {
			continue
		}
		keys := a.bytes(nf * (al + 8))
		set := a.elems(nf)
		add := func(addr netip.Addr, port uint16) {
			at := len(keys)
			keys = appendEntry(keys, addr, sp.Port.Protocol, port)
			set = append(set, elem{key: keys[at:len(keys):len(keys)]})
		}
		for fe := range sp.AllFrontends() {
			if external(fe) == c.external {
				add(fe.Addr, fe.Port)
			}
		}
		fr.add(shapeSet(f, c.verdicts), set...)
		for i, to := range routed(c.verdicts, pods) {
			if !to || spread[i].n == 0 {
				continue
			}
			fr.add(bucketSet(f, i == 1, spread[i].n), set...)
			if owners[i] == nil {
				owners[i] = bucketOwners(targets(sp, i), spread[i].counts, spread[i].n, a)
			}
			per := int(spread[i].n)
			es := a.elems(nf * per)
			buf := a.bytes(nf * per * (2*al + 16))
			for _, k := range set {
				es, buf = endpointElems(es, buf, k.key, uint32(i)*bucketStride, targets(sp, i), owners[i])
			}
			fr.add(fixedSet(kindEndpoints, f), es...)
		}
	}
}

// arena hands out the memory of fragments' elements from large chunks, so
// that a write of a whole table allocates about what its batch holds,
// not a little for each port. Bytes it handed out it never takes back;
// elements it takes back when told (reuseElems), and the scratch of
// bucketOwners when a port's elements are made (reuseScratch). A nil
// arena allocates each request.
type arena struct {
	b []byte
	e []elem
	i []int32
	t []ticket
}

// bytes returns an empty slice with room for n bytes.
func (a *arena) bytes(n int) []byte {
	return take(a, func(a *arena) *[]byte { return &a.b }, n, 64<<10)
}

// elems returns an empty slice with room for n elements.
func (a *arena) elems(n int) []elem { return take(a, func(a *arena) *[]elem { return &a.e }, n, 1024) }

// int32s returns n zeroed int32s of scratch.
func (a *arena) int32s(n int) []int32 {
	s := take(a, func(a *arena) *[]int32 { return &a.i }, n, 4096)[:n]
	clear(s)
	return s
}

// tickets returns an empty slice of scratch with room for n tickets.
func (a *arena) tickets(n int) []ticket {
	return take(a, func(a *arena) *[]ticket { return &a.t }, n, 1024)
}

// take returns an empty slice with room for n values from the arena's
// chunk of them (field), which it replaces by a new one of at least size
// values when it has not that room left; from no arena, a slice of its
// own.
func take[T any](a *arena, field func(*arena) *[]T, n, size int) []T {
	if a == nil {
		return make([]T, 0, n)
	}
	chunk := field(a)
	if cap(*chunk)-len(*chunk) < n {
		*chunk = make([]T, 0, max(size, n))
	}
	at := len(*chunk)
	*chunk = (*chunk)[:at+n]
	return (*chunk)[at : at : at+n]
}

// reuseScratch hands out again the scratch handed out so far.
func (a *arena) reuseScratch() {
	if a != nil {
		a.i, a.t = a.i[:0], a.t[:0]
	}
}

// reuseElems hands out again the elements handed out so far: none of
// them is in use any more.
func (a *arena) reuseElems() { a.e = a.e[:0] }

// frontends returns the number of a port's frontends of one kind.
func frontends(sp *servicelb.ServicePort, ext bool) int {
	n := 0
	for fe := range sp.AllFrontends() {
		if external(fe) == ext {
			n++
		}
	}
	return n
}

// external tells whether a frontend is of the external kind: an external
// IP, a load-balancer IP or a node port, not the cluster IP.
func external(fe servicelb.Frontend) bool { return fe.Kind != servicelb.ClusterIPFrontend }

// chainNames calls f with the name of each chain of a planned port, as
// its fragment makes them: none for a port without affinity.
func chainNames(pp *portPlan, f func(name string)) {
	if pp.sp.Affinity == 0 {
		return
	}
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

// balancer spreads a port's traffic over one set of endpoints: the chain
// that does, shared (chainBalance) or an affinity port's own.
type balancer struct {
	chain string
}

// rule matches the terms, then goes to the balancer's chain.
func (b balancer) rule(match ...term) *rule {
	return mkOwn(append(slices.Clip(match), goTo(b.chain))...)
}

// lb plans the load balancing of an affinity port over bs in the slot: a
// chain of its own with a rule per endpoint, since a pinned client must
// find its own endpoint.
func (p *planner) lb(fr *fragment, sp *servicelb.ServicePort, key slotKey, slot uint32, bs []servicelb.Backend) balancer {
	f, proto := sp.Family, sp.Port.Protocol
	rules, eps := affinityRules(f, proto, fixedSet(kindAffinity, f).name(), key.chain(), slot, bs, sp.Affinity)
	fr.chains = append(fr.chains, chainPlan{name: key.chain(), rules: append(rules, p.drop)})
	fr.chains = append(fr.chains, eps...)
	return balancer{chain: key.chain()}
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

// entries plans an affinity port's elements in the dispatch map; kinds
// are the port's entry chains (entryKinds).
func entries(fr *fragment, sp *servicelb.ServicePort, kinds []entryChain) {
	ents := make([]elem, 0, 1+len(sp.ExternalIPs)+len(sp.LoadBalancerIPs)+len(sp.NodeIPs))
	for fe := range sp.AllFrontends() {
		chain := kinds[0].name
		if external(fe) {
			chain = kinds[len(kinds)-1].name
		}
		ents = append(ents, elem{key: entryBytes(fe.Addr, sp.Port.Protocol, fe.Port), chain: chain})
	}
	fr.add(fixedSet(kindServices, sp.Family), ents...)
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
