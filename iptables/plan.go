//go:build linux

package iptables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// dispatch identifies a chain that holds rules of many service ports,
// each port's rules under its own key: the chains that a change to one
// port edits rule by rule instead of rewriting.
type dispatch int

const (
	natServices dispatch = iota
	natNodePorts
	filterServices
	filterExternal
	filterNodePorts
	numDispatch
)

// dispatchChains lists the table and fixed chain name of each dispatch.
var dispatchChains = [numDispatch]struct {
	table xtables.TableName
	chain string
}{
	natServices:     {xtables.NAT, chainServices},
	natNodePorts:    {xtables.NAT, chainNodePorts},
	filterServices:  {xtables.Filter, chainServices},
	filterExternal:  {xtables.Filter, chainExternalServices},
	filterNodePorts: {xtables.Filter, chainNodePorts},
}

// tailKey sorts after every service port key: the node's own rules at the
// end of a dispatch chain (kube-proxy's "this must be the last rule").
const tailKey = "\xff"

// clusterIPKey keys the rules that reject flows to a service's cluster
// IPs on ports it does not have. Service port keys are printable ASCII,
// so these sort after every port's rules and before the tail.
func clusterIPKey(service string) string { return "\xfe" + service }

// portRules are the rules one service port owns: its nat chains, written
// whole, and its rules in the dispatch chains.
type portRules struct {
	chains   []xtables.Chain
	dispatch [numDispatch][]xtables.Rule
}

// planner builds rules for one address family of one node.
type planner struct {
	n      names
	family servicelb.Family
	fam    xtables.Family
	node   *servicelb.NodeConfig
	masq   uint32
	drop   uint32
	// liberal: Options.ConntrackTCPLiberal.
	liberal bool
	// pods is how the node's pods are recognised in the family: by a
	// source in one of its prefixes, or by the input interface.
	pods servicelb.LocalMatch
	// nodePortIPs are the node addresses that serve node ports.
	nodePortIPs []netip.Addr
	// markMasq jumps to the chain that marks a flow for masquerade.
	markMasq xtables.Target
	// buf is scratch space for the text of comments.
	buf []byte
	// arena, when set, holds the rules of the port chains planned last:
	// planning the next port reuses it (see portChains).
	arena *arena
}

// arena is room for the rules of one port's chains, reused port after
// port, so that planning many ports in a row leaves little garbage.
type arena struct {
	rules   []xtables.Rule
	matches []xtables.Match
	chains  []xtables.Chain
	seps    map[string]servicelb.Backend
}

// reset makes the arena's room free again; what was planned in it is
// overwritten by the next port.
func (a *arena) reset() {
	clear(a.rules)
	clear(a.matches)
	a.rules, a.matches, a.chains = a.rules[:0], a.matches[:0], a.chains[:0]
	clear(a.seps)
}

// carve returns n elements of room at the end of *buf, growing it (to a
// new array, leaving what was carved before in place) when it is full.
func carve[T any](buf *[]T, n int) []T {
	if cap(*buf)-len(*buf) < n {
		*buf = make([]T, 0, max(2*cap(*buf), n, 64))
	}
	i := len(*buf)
	*buf = (*buf)[:i+n]
	return (*buf)[i : i : i+n]
}

// rules returns an empty slice with room for n rules: the arena's, or new.
func (p *planner) rules(n int) []xtables.Rule {
	if p.arena == nil {
		return make([]xtables.Rule, 0, n)
	}
	return carve(&p.arena.rules, n)
}

// matches returns ms in a slice of its own: the arena's, or new.
func (p *planner) matches(ms ...xtables.Match) []xtables.Match {
	if p.arena == nil {
		return slices.Clone(ms)
	}
	return append(carve(&p.arena.matches, len(ms)), ms...)
}

func newPlanner(n names, f servicelb.Family, node *servicelb.NodeConfig, o *Options) *planner {
	return &planner{n: n, family: f, fam: xfam(f), node: node, masq: node.MasqueradeMark(), drop: o.dropMark(),
		liberal: o.ConntrackTCPLiberal, nodePortIPs: node.NodePortIPs(f), pods: node.LocalMatch(f),
		markMasq: xtables.Jump(n.fixed(chainMarkMasq))}
}

func xfam(f servicelb.Family) xtables.Family {
	if f == servicelb.IPv6 {
		return xtables.IPv6
	}
	return xtables.IPv4
}

func host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// portPlan is what the rules of one service port are built from.
type portPlan struct {
	sp    *servicelb.ServicePort
	name  string // kube-proxy's name of the port, "namespace/service:port"
	proto uint8
	// internal and external are the port's verdicts as the rules render
	// them (see planner.verdicts).
	internal, external servicelb.Verdicts
	// ext: the port has external frontends and an external verdict
	// forwards, so it has an EXT chain; fw: its load-balancer IPs have
	// source ranges, so they go through an FW chain first.
	ext, fw bool
}

func (p *planner) plan(sp *servicelb.ServicePort) *portPlan {
	s := &portPlan{sp: sp, name: portName(sp), proto: sp.Port.Protocol.Number()}
	s.internal = p.verdicts(sp, sp.Internal)
	s.external = p.verdicts(sp, sp.External)
	frontends := len(sp.ExternalIPs)+len(sp.LoadBalancerIPs)+len(sp.NodeIPs) > 0
	s.ext = frontends && slices.ContainsFunc(s.external[:], func(v servicelb.Verdict) bool { return v.Action.Forwards() })
	s.fw = s.ext && len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
	return s
}

// verdicts returns the verdicts as the rules tell origins apart: a pod is
// told apart only where the node recognises its pods (elsewhere its flows
// are the outside's), and a forward to no endpoint drops.
func (p *planner) verdicts(sp *servicelb.ServicePort, vs servicelb.Verdicts) servicelb.Verdicts {
	for o, v := range vs {
		if v.Action.Forwards() && len(sp.Targets(v)) == 0 {
			vs[o] = servicelb.Verdict{Action: servicelb.Drop}
		}
	}
	if !p.pods.Detects() {
		vs[servicelb.FromPod] = vs[servicelb.FromOutside]
	}
	return vs
}

// internalUses reports whether a verdict for the cluster IP has action a.
func (s *portPlan) internalUses(a servicelb.Action) bool {
	return s.sp.ClusterIP.IsValid() && slices.ContainsFunc(s.internal[:], func(v servicelb.Verdict) bool { return v.Action == a })
}

// uses reports whether a verdict the rules render has action a.
func (s *portPlan) uses(a servicelb.Action) bool {
	return s.internalUses(a) || (s.ext && slices.ContainsFunc(s.external[:], func(v servicelb.Verdict) bool { return v.Action == a }))
}

// policyChain returns the chain that spreads flows over the endpoints of
// a forwarding action: SVC for the cluster set, SVL for the local one.
func (p *planner) policyChain(sp *servicelb.ServicePort, a servicelb.Action) string {
	if a == servicelb.ToLocal {
		return p.n.svl(sp)
	}
	return p.n.svc(sp)
}

// distinct reports which origins need rules of their own ahead of the
// rule for the rest (flows from outside), given what each origin gets:
// the node when it gets something else than outside, pods (where the node
// recognises them) when they get something else than what they would
// reach otherwise. Pods are tested first, since a pod address may be
// local.
func distinct[K comparable](ks [3]K, pods bool) (podRules, nodeRules bool) {
	nodeRules = ks[servicelb.FromNode] != ks[servicelb.FromOutside]
	podRules = pods && (ks[servicelb.FromPod] != ks[servicelb.FromOutside] || (nodeRules && ks[servicelb.FromPod] != ks[servicelb.FromNode]))
	return podRules, nodeRules
}

// forPods returns r restricted to the pods' flows: once per source
// prefix of the detection, or once with the pods' input interface.
func (p *planner) forPods(r xtables.Rule) []xtables.Rule {
	return xtables.Pods(xtables.Local(p.pods), r)
}

// forNode returns r matching only locally sent flows: source addresses
// of the node's own, after its comment.
func forNode(r xtables.Rule) xtables.Rule {
	ms := slices.Clone(r.Matches)
	for i, m := range ms {
		if at, ok := m.(xtables.AddrType); ok {
			at.Src = xtables.AddrTypeLocal
			ms[i] = at
			r.Matches = ms
			return r
		}
	}
	at := 0
	if len(ms) > 0 {
		if _, ok := ms[0].(xtables.Comment); ok {
			at = 1
		}
	}
	r.Matches = slices.Insert(ms, at, xtables.Match(xtables.AddrType{Src: xtables.AddrTypeLocal}))
	return r
}

// byOrigin returns the rules that give each origin's flows its target
// (rule(t) builds the rule for target t): rules for pods and for the node
// where their target differs from the one they would reach otherwise,
// then one for the rest, the outside target. The rest take no rule when
// their target is RETURN; a nil target of pods or the node means that
// their flows never come here (any target does).
func (p *planner) byOrigin(ts [3]xtables.Target, rule func(xtables.Target) xtables.Rule) []xtables.Rule {
	rest, pods, local := ts[servicelb.FromOutside], ts[servicelb.FromPod], ts[servicelb.FromNode]
	nodeRules := local != nil && local != rest
	podRules := p.pods.Detects() && pods != nil && (pods != rest || (nodeRules && pods != local))
	var out []xtables.Rule
	if podRules {
		out = append(out, p.forPods(rule(pods))...)
	}
	if nodeRules {
		out = append(out, forNode(rule(local)))
	}
	if rest != nil && rest != xtables.Target(xtables.Return) {
		out = append(out, rule(rest))
	}
	return out
}

// natTargets returns where the nat table sends each origin's flows to a
// frontend whose verdicts are vs: the policy chain of a forward, else
// nowhere (RETURN, so that the flow reaches the filter table untranslated).
func (p *planner) natTargets(sp *servicelb.ServicePort, vs servicelb.Verdicts) [3]xtables.Target {
	var ts [3]xtables.Target
	for o, v := range vs {
		ts[o] = xtables.Return
		if v.Action.Forwards() {
			ts[o] = xtables.Jump(p.policyChain(sp, v.Action))
		}
	}
	return ts
}

// filterTargets returns what the filter table does with each origin's
// flows to a frontend whose verdicts are vs: REJECT or DROP. A forwarded
// flow reaches the filter table translated, no longer addressed to the
// frontend, so a forwarding origin gets no target (nil), except that the
// rest (outside) take the target of the node or else of pods, so that
// one rule without origin matches serves them. All nil when every origin
// is forwarded.
func filterTargets(vs servicelb.Verdicts) [3]xtables.Target {
	var ts [3]xtables.Target
	for o, v := range vs {
		switch v.Action {
		case servicelb.Reject:
			ts[o] = xtables.Reject{}
		case servicelb.Drop:
			ts[o] = xtables.Drop
		}
	}
	if ts[servicelb.FromOutside] == nil {
		ts[servicelb.FromOutside] = cmp.Or(ts[servicelb.FromNode], ts[servicelb.FromPod])
	}
	return ts
}

// filterComment is kube-proxy's comment of a filter rule for a port.
func filterComment(s *portPlan, t xtables.Target) xtables.Comment {
	if t == xtables.Target(xtables.Drop) {
		return xtables.Comment(s.name + " has no local endpoints")
	}
	return xtables.Comment(s.name + " has no endpoints")
}

// port returns every rule service port sp owns.
func (p *planner) port(sp *servicelb.ServicePort) portRules {
	s := p.plan(sp)
	r := p.dispatchRules(s)
	r.chains = p.chains(s)
	return r
}

// dispatchRules returns the port's rules in the dispatch chains.
func (p *planner) dispatchRules(s *portPlan) portRules {
	var r portRules
	p.clusterIP(&r, s)
	p.external(&r, s)
	return r
}

// chains returns the port's own chains.
func (p *planner) chains(s *portPlan) []xtables.Chain {
	sp := s.sp
	var out []xtables.Chain
	var seps map[string]servicelb.Backend
	if a := p.arena; a != nil {
		a.reset()
		out, seps = a.chains, a.seps
	} else {
		out = make([]xtables.Chain, 0, 4+len(sp.Cluster)+len(sp.Local))
		seps = make(map[string]servicelb.Backend, len(sp.Cluster))
	}
	if s.ext {
		out = append(out, xtables.Chain{Name: p.n.ext(sp), Rules: p.extRules(s)})
	}
	if s.fw {
		out = append(out, xtables.Chain{Name: p.n.fw(sp), Rules: p.fwRules(s)})
	}
	for _, a := range []servicelb.Action{servicelb.ToCluster, servicelb.ToLocal} {
		if s.uses(a) {
			out = append(out, xtables.Chain{Name: p.policyChain(sp, a), Rules: p.policyRules(s, a, seps)})
		}
	}
	for name, b := range seps {
		out = append(out, xtables.Chain{Name: name, Rules: p.sepRules(s, name, b)})
	}
	if p.arena != nil {
		p.arena.chains = out
	}
	return out
}

// clusterIP writes the rules for the port's cluster IP: in nat
// SERVICES to the policy chain of each origin's verdict, in filter
// SERVICES the rejects and drops.
func (p *planner) clusterIP(r *portRules, s *portPlan) {
	cip := s.sp.ClusterIP
	if !cip.IsValid() {
		return
	}
	r.dispatch[natServices] = p.byOrigin(p.natTargets(s.sp, s.internal), func(t xtables.Target) xtables.Rule {
		return p.vipRule(s, cip, xtables.Comment(s.name+" cluster IP"), t)
	})
	r.dispatch[filterServices] = p.byOrigin(filterTargets(s.internal), func(t xtables.Target) xtables.Rule {
		return p.vipRule(s, cip, filterComment(s, t), t)
	})
}

// external writes the rules for the port's external IPs, load-balancer
// IPs and node ports: in nat to the EXT chain (through the FW chain for
// load-balancer IPs with source ranges) when it has one, in filter the
// rejects and drops; and the health check node port's accept.
func (p *planner) external(r *portRules, s *portPlan) {
	sp := s.sp
	filter := filterTargets(s.external)
	lbChain := p.n.ext(sp)
	if s.fw {
		lbChain = p.n.fw(sp)
	}
	for _, vips := range []struct {
		addrs   []netip.Addr
		comment string
		chain   string
	}{{sp.ExternalIPs, " external IP", p.n.ext(sp)}, {sp.LoadBalancerIPs, " loadbalancer IP", lbChain}} {
		for _, a := range vips.addrs {
			if s.ext {
				r.dispatch[natServices] = append(r.dispatch[natServices], p.vipRule(s, a, xtables.Comment(s.name+vips.comment), xtables.Jump(vips.chain)))
			}
			r.dispatch[filterExternal] = append(r.dispatch[filterExternal], p.byOrigin(filter, func(t xtables.Target) xtables.Rule {
				return p.vipRule(s, a, filterComment(s, t), t)
			})...)
		}
	}
	p.nodePorts(r, s, filter)
	if hc := sp.HealthCheckNodePort; hc != 0 {
		r.dispatch[filterNodePorts] = append(r.dispatch[filterNodePorts], xtables.Rule{Proto: xtables.ProtoTCP,
			Matches: []xtables.Match{xtables.Comment(s.name + " health check node port"), xtables.Port{Proto: xtables.ProtoTCP, DPort: hc}},
			Target:  xtables.Accept})
	}
}

// nodePorts writes the rules for the port's node port. Served on every
// node port address, they match the port alone, as kube-proxy's (the
// nat rules are reached only for those addresses, the filter rules match
// every local address); served on some of them (another service holds
// the port on the others), they match each address.
func (p *planner) nodePorts(r *portRules, s *portPlan, filter [3]xtables.Target) {
	sp := s.sp
	if len(sp.NodeIPs) == 0 {
		return
	}
	np := sp.Port.NodePort
	dsts := []netip.Prefix{{}}
	if !slices.Equal(sp.NodeIPs, p.nodePortIPs) {
		dsts = dsts[:0]
		for _, a := range sp.NodeIPs {
			dsts = append(dsts, host(a))
		}
	}
	for _, dst := range dsts {
		if s.ext {
			r.dispatch[natNodePorts] = append(r.dispatch[natNodePorts], xtables.Rule{Dst: dst, Proto: s.proto,
				Matches: []xtables.Match{xtables.Comment(s.name), xtables.Port{Proto: s.proto, DPort: np}},
				Target:  xtables.Jump(p.n.ext(sp))})
		}
		r.dispatch[filterExternal] = append(r.dispatch[filterExternal], p.byOrigin(filter, func(t xtables.Target) xtables.Rule {
			ms := []xtables.Match{filterComment(s, t), xtables.AddrType{Dst: xtables.AddrTypeLocal}, xtables.Port{Proto: s.proto, DPort: np}}
			if dst.IsValid() {
				ms = slices.Delete(ms, 1, 2)
			}
			return xtables.Rule{Dst: dst, Proto: s.proto, Matches: ms, Target: t}
		})...)
	}
}

// vipRule matches the port's traffic to one of its virtual addresses.
func (p *planner) vipRule(s *portPlan, a netip.Addr, comment xtables.Comment, t xtables.Target) xtables.Rule {
	return xtables.Rule{Dst: host(a), Proto: s.proto,
		Matches: []xtables.Match{comment, xtables.Port{Proto: s.proto, DPort: s.sp.Port.Port}},
		Target:  t}
}

// extRules fill the EXT chain, where external traffic takes its verdict:
// the pods' and the node's flows first where their verdict differs, each
// marked for masquerade when their verdict says so and sent to its policy
// chain (or back, untranslated, when it is not forwarded), then the rest.
// Under the external Cluster policy this is kube-proxy's masquerade and
// jump to SVC; under Local, its pod and LOCAL short-circuits to SVC and
// the jump to SVL.
func (p *planner) extRules(s *portPlan) []xtables.Rule {
	vs := s.external
	markMasq := p.markMasq
	dest := func(v servicelb.Verdict) xtables.Target {
		if v.Action.Forwards() {
			return xtables.Jump(p.policyChain(s.sp, v.Action))
		}
		return xtables.Return
	}
	comment := func(format string) xtables.Comment { return xtables.Comment(fmt.Sprintf(format, s.name)) }
	var out []xtables.Rule
	podRules, nodeRules := distinct(vs, p.pods.Detects())
	if podRules {
		for _, pod := range p.forPods(xtables.Rule{}) {
			if vs[servicelb.FromPod].Masquerade {
				m := pod
				m.Matches, m.Target = []xtables.Match{comment("masquerade pod traffic for %s external destinations")}, markMasq
				out = append(out, m)
			}
			pod.Matches, pod.Target = []xtables.Match{comment("pod traffic for %s external destinations")}, dest(vs[servicelb.FromPod])
			out = append(out, pod)
		}
	}
	if nodeRules {
		if vs[servicelb.FromNode].Masquerade {
			out = append(out, forNode(xtables.Rule{Matches: []xtables.Match{comment("masquerade LOCAL traffic for %s external destinations")}, Target: markMasq}))
		}
		out = append(out, forNode(xtables.Rule{Matches: []xtables.Match{comment("route LOCAL traffic for %s external destinations")}, Target: dest(vs[servicelb.FromNode])}))
	}
	if vs[servicelb.FromOutside].Masquerade {
		out = append(out, xtables.Rule{Matches: []xtables.Match{comment("masquerade traffic for %s external destinations")}, Target: markMasq})
	}
	if vs[servicelb.FromOutside].Action.Forwards() {
		out = append(out, xtables.Rule{Target: dest(vs[servicelb.FromOutside])})
	}
	return out
}

// fwRules fill the FW chain: flows from the source ranges go on to the
// EXT chain; others are marked for PROXY-FIREWALL to drop. When an origin
// is rejected, the allowed sources go to the EXT chain without return,
// so that its flows, which the EXT chain sends back, reach the filter
// table's reject unmarked.
func (p *planner) fwRules(s *portPlan) []xtables.Rule {
	sp := s.sp
	comment := xtables.Comment(s.name + " loadbalancer IP")
	var ext xtables.Target = xtables.Jump(p.n.ext(sp))
	if slices.ContainsFunc(s.external[:], func(v servicelb.Verdict) bool { return v.Action == servicelb.Reject }) {
		ext = xtables.Goto(p.n.ext(sp))
	}
	var out []xtables.Rule
	for _, r := range sp.SourceRanges {
		out = append(out, xtables.Rule{Src: r, Matches: []xtables.Match{comment}, Target: ext})
	}
	return append(out, xtables.Rule{
		Matches: []xtables.Match{xtables.Comment("other traffic to " + s.name + " will be dropped by " + p.n.fixed(chainProxyFirewall))},
		Target:  xtables.Jump(p.n.fixed(chainMarkDrop))})
}

// policyRules fill the SVC (a == ToCluster) or SVL (ToLocal) chain: when
// traffic to the cluster IP comes here, its masquerade rules first, then
// affinity checks, then one rule per endpoint, each taken with its share
// of the weight that remains. The SEP chains the rules jump to are added
// to seps.
func (p *planner) policyRules(s *portPlan, a servicelb.Action, seps map[string]servicelb.Backend) []xtables.Rule {
	sp := s.sp
	var masq []xtables.Rule
	if s.internalUses(a) {
		masq = p.masqRules(s)
	}
	backends := sp.Targets(servicelb.Verdict{Action: a})
	type ep struct {
		b       servicelb.Backend
		sep     string
		comment xtables.Comment
	}
	eps := make([]ep, len(backends))
	total := 0
	for i, b := range backends {
		p.buf = b.AddrPort().AppendTo(append(append(p.buf[:0], s.name...), " -> "...))
		eps[i] = ep{b, p.n.sep(sp, b), xtables.Comment(p.buf)}
		seps[eps[i].sep] = b
		total += int(b.Weight)
	}
	n := len(masq) + len(eps)
	if sp.Affinity > 0 {
		n += len(eps)
	}
	out := append(p.rules(n), masq...)
	if sp.Affinity > 0 {
		for _, e := range eps {
			out = append(out, xtables.Rule{Matches: p.matches(e.comment,
				xtables.Recent{Name: e.sep, Mode: xtables.RecentCheck, Seconds: affinitySeconds(sp), Reap: true}),
				Target: xtables.Jump(e.sep)})
		}
	}
	for i, e := range eps {
		var ms []xtables.Match
		if i < len(eps)-1 {
			ms = p.matches(e.comment, p.probability(int(e.b.Weight), total))
		} else {
			ms = p.matches(e.comment)
		}
		total -= int(e.b.Weight)
		out = append(out, xtables.Rule{Matches: ms, Target: xtables.Jump(e.sep)})
	}
	return out
}

// affinitySeconds returns the affinity timeout, a whole number of seconds.
func affinitySeconds(sp *servicelb.ServicePort) uint32 {
	return uint32(sp.Affinity / time.Second)
}

// probability returns the statistic match that takes weight w of the
// remaining total, computed from kube-proxy's "%0.10f" text as iptables
// would parse it.
func (p *planner) probability(w, total int) xtables.Statistic {
	p.buf = strconv.AppendFloat(p.buf[:0], float64(w)/float64(total), 'f', 10, 64)
	f, _ := strconv.ParseFloat(string(p.buf), 64)
	return xtables.Probability(f)
}

// sepRules fill a SEP chain: masquerade hairpin traffic (an endpoint
// reaching itself through its service), remember the client for
// affinity, and DNAT to the endpoint.
func (p *planner) sepRules(s *portPlan, chain string, b servicelb.Backend) []xtables.Rule {
	comment := xtables.Comment(s.name)
	var ms []xtables.Match
	if s.sp.Affinity > 0 {
		ms = p.matches(comment, xtables.Recent{Name: chain, Mode: xtables.RecentSet}, xtables.Port{Proto: s.proto})
	} else {
		ms = p.matches(comment, xtables.Port{Proto: s.proto})
	}
	dnat := xtables.Rule{Proto: s.proto, Matches: ms, Target: xtables.DNAT{To: b.AddrPort()}}
	if s.sp.IsHairpin(b.Addr) {
		return append(p.rules(2), xtables.Rule{Src: host(b.Addr), Matches: p.matches(comment), Target: p.markMasq}, dnat)
	}
	return append(p.rules(1), dnat)
}

// clusterIPRules returns the rules that reject the flows to the cluster
// IPs of one service's ports (of the planner's family) that reach the
// filter table still addressed to them: flows on ports the service does
// not have, since the nat table translated every flow a port forwards
// and the ports' own rules, before these, took the rest.
func (p *planner) clusterIPRules(service string, ports []*servicelb.ServicePort) []xtables.Rule {
	var ips []netip.Addr
	for _, sp := range ports {
		if sp.Family == p.family && sp.ClusterIP.IsValid() && !slices.Contains(ips, sp.ClusterIP) {
			ips = append(ips, sp.ClusterIP)
		}
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	out := make([]xtables.Rule, 0, len(ips))
	for _, a := range ips {
		out = append(out, xtables.Rule{Dst: host(a),
			Matches: []xtables.Match{xtables.Comment(service + " cluster IP: undefined port")},
			Target:  xtables.Reject{}})
	}
	return out
}

// masqRules mark traffic to the cluster IP for masquerade by origin, as
// the internal verdicts say (the masquerade of an origin whose flows are
// not forwarded does not matter). kube-proxy's shapes: every origin
// (MasqueradeAll), one rule; every origin but pods (traffic from off the
// cluster), one rule with "! -s CIDR" or "! -i cbr0" (or "! -i veth+"), or
// through OFFCLUSTER-MASQ with several prefixes; none, no rule. Any other
// choice is marked in order, for outside, then the node, then pods, each
// rule setting or clearing the mark, so that the last rule that matches
// decides.
func (p *planner) masqRules(s *portPlan) []xtables.Rule {
	var want, care [3]bool
	all, none, offCluster := true, true, p.pods.Detects()
	for o, v := range s.internal {
		want[o], care[o] = v.Masquerade, v.Action.Forwards()
		if care[o] {
			all, none = all && want[o], none && !want[o]
			offCluster = offCluster && want[o] == (servicelb.Origin(o) != servicelb.FromPod)
		}
	}
	r := p.vipRule(s, s.sp.ClusterIP, xtables.Comment(s.name+" cluster IP"), p.markMasq)
	switch {
	case none:
		return nil
	case all:
		return []xtables.Rule{r}
	case offCluster:
		if one, ok := xtables.NotPods(xtables.Local(p.pods), r); ok {
			return []xtables.Rule{one}
		}
		r.Target = xtables.Jump(p.n.fixed(chainOffClusterMasq))
		return []xtables.Rule{r}
	}
	// An origin that is not forwarded takes the choice of the first
	// forwarded one, so that it needs no rule of its own.
	for _, o := range []servicelb.Origin{servicelb.FromOutside, servicelb.FromNode, servicelb.FromPod} {
		if care[o] {
			for i := range want {
				if !care[i] {
					want[i] = want[o]
				}
			}
			break
		}
	}
	mark := func(masq bool) xtables.Rule {
		m := r
		if !masq {
			m.Target = xtables.SetMark{Mask: p.masq}
		}
		return m
	}
	var out []xtables.Rule
	if want[servicelb.FromOutside] {
		out = append(out, r)
	}
	podRules, nodeRules := distinct(want, p.pods.Detects())
	if nodeRules {
		out = append(out, forNode(mark(want[servicelb.FromNode])))
	}
	if podRules {
		out = append(out, p.forPods(mark(want[servicelb.FromPod]))...)
	}
	return out
}

// checkChanges checks the ports that changes add or change.
func (px *Proxier) checkChanges(ch *servicelb.Changes) error {
	for _, c := range ch.Changed {
		if err := px.checkPorts(c.New); err != nil {
			return err
		}
	}
	return px.checkPorts(ch.Added...)
}

// dispatchTable returns the table and chain of a dispatch chain.
func (p *planner) dispatchTable(d dispatch) (xtables.Table, string) {
	c := dispatchChains[d]
	return xtables.Table{Family: p.fam, Name: c.table}, p.n.fixed(c.chain)
}

// checkPorts reports the first service port of the Proxier's families
// that its capabilities refuse, with servicelb's error unchanged.
func (px *Proxier) checkPorts(ports ...*servicelb.ServicePort) error {
	caps := px.Capabilities()
	for _, sp := range ports {
		if !slices.Contains(px.opts.Families, sp.Family) {
			continue
		}
		if err := caps.CheckPort(sp); err != nil {
			return err
		}
	}
	return nil
}

// checkNode refuses a node the Proxier's capabilities cannot serve and
// one whose masquerade mark is the drop mark.
func (px *Proxier) checkNode(node *servicelb.NodeConfig) error {
	caps := px.Capabilities()
	if err := caps.CheckNode(node); err != nil {
		return err
	}
	if node.MasqueradeMark() == px.opts.dropMark() {
		return fmt.Errorf("%w: the node's masquerade mark %#x is the drop mark", ErrInvalidOptions, px.opts.dropMark())
	}
	return nil
}
