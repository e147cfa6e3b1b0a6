package iptables

import (
	"fmt"
	"net/netip"
	"strconv"

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

// portRules are the rules one service port owns: its nat chains, written
// whole, and its rules in the dispatch chains.
type portRules struct {
	chains   []xtables.Chain
	dispatch [numDispatch][]xtables.Rule
}

// planner builds rules for one address family of one node.
type planner struct {
	n      names
	fam    xtables.Family
	node   *servicelb.NodeConfig
	masq   uint32
	drop   uint32
	cidrs  []netip.Prefix
	single bool // exactly one cluster CIDR: masquerade with "! -s CIDR"
}

func newPlanner(n names, f servicelb.Family, node *servicelb.NodeConfig, dropMark uint32) *planner {
	p := &planner{n: n, fam: xfam(f), node: node, masq: node.MasqueradeMark(), drop: dropMark}
	for _, c := range node.ClusterCIDRs {
		if c.Addr().Is4() == (f == servicelb.IPv4) {
			p.cidrs = append(p.cidrs, c)
		}
	}
	p.single = len(p.cidrs) == 1
	return p
}

func xfam(f servicelb.Family) xtables.Family {
	if f == servicelb.IPv6 {
		return xtables.IPv6
	}
	return xtables.IPv4
}

func host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// portState sums up which chains a service port uses, kube-proxy's way.
type portState struct {
	sp                      *servicelb.ServicePort
	name                    string // "namespace/service:port"
	proto                   uint8
	hasEndpoints            bool
	hasInternal, hasExtern  bool
	usesCluster, usesLocal  bool
	usesExt, usesFW         bool
	internalChain, extChain string
	extPolicyChain          string
}

func (p *planner) state(sp *servicelb.ServicePort) *portState {
	s := &portState{sp: sp, name: portName(sp), proto: sp.Port.Protocol.Number()}
	s.hasEndpoints = sp.HasBackends()
	s.hasInternal = len(sp.InternalBackends()) > 0
	s.hasExtern = len(sp.ExternalBackends()) > 0
	s.usesExt = s.hasEndpoints && sp.External()
	s.usesFW = s.usesExt && len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
	s.usesCluster = len(sp.Cluster) > 0 && (!sp.InternalLocal || s.usesExt)
	s.usesLocal = len(sp.Local) > 0 && (sp.InternalLocal || (s.usesExt && sp.ExternalLocal))
	s.internalChain = p.n.svc(sp)
	if sp.InternalLocal {
		s.internalChain = p.n.svl(sp)
	}
	s.extPolicyChain = p.n.svc(sp)
	if sp.ExternalLocal {
		s.extPolicyChain = p.n.svl(sp)
	}
	s.extChain = p.n.ext(sp)
	return s
}

// port returns every rule service port sp owns.
func (p *planner) port(sp *servicelb.ServicePort) portRules {
	s := p.state(sp)
	var r portRules
	p.capture(&r, s)
	if s.usesExt {
		r.chains = append(r.chains, xtables.Chain{Name: s.extChain, Rules: p.extRules(s)})
	}
	if s.usesFW {
		r.chains = append(r.chains, xtables.Chain{Name: p.n.fw(sp), Rules: p.fwRules(s)})
	}
	seps := map[string]servicelb.Backend{}
	if s.usesCluster {
		r.chains = append(r.chains, xtables.Chain{Name: p.n.svc(sp), Rules: p.policyRules(s, p.n.svc(sp), sp.Cluster, seps)})
	}
	if s.usesLocal {
		r.chains = append(r.chains, xtables.Chain{Name: p.n.svl(sp), Rules: p.policyRules(s, p.n.svl(sp), sp.Local, seps)})
	}
	for name, b := range seps {
		r.chains = append(r.chains, xtables.Chain{Name: name, Rules: p.sepRules(s, name, b)})
	}
	return r
}

// capture writes the rules that steer a port's traffic from the dispatch
// chains: to its chains when it has endpoints, else to REJECT or DROP.
func (p *planner) capture(r *portRules, s *portState) {
	sp := s.sp
	filterTarget := func() (xtables.Target, string) {
		if !s.hasEndpoints {
			return xtables.Reject{}, s.name + " has no endpoints"
		}
		return xtables.Drop, s.name + " has no local endpoints"
	}
	if sp.ClusterIP.IsValid() {
		if s.hasInternal {
			r.dispatch[natServices] = append(r.dispatch[natServices], p.vipRule(s, sp.ClusterIP, s.name+" cluster IP", xtables.Jump(s.internalChain)))
		} else {
			t, c := filterTarget()
			r.dispatch[filterServices] = append(r.dispatch[filterServices], p.vipRule(s, sp.ClusterIP, c, t))
		}
	}
	lbChain := s.extChain
	if s.usesFW {
		lbChain = p.n.fw(sp)
	}
	for _, vips := range []struct {
		addrs   []netip.Addr
		comment string
		chain   string
	}{{sp.ExternalIPs, " external IP", s.extChain}, {sp.LoadBalancerIPs, " loadbalancer IP", lbChain}} {
		for _, a := range vips.addrs {
			if s.hasEndpoints {
				r.dispatch[natServices] = append(r.dispatch[natServices], p.vipRule(s, a, s.name+vips.comment, xtables.Jump(vips.chain)))
			}
			if !s.hasExtern {
				t, c := filterTarget()
				r.dispatch[filterExternal] = append(r.dispatch[filterExternal], p.vipRule(s, a, c, t))
			}
		}
	}
	if np := sp.Port.NodePort; np != 0 {
		if s.hasEndpoints {
			r.dispatch[natNodePorts] = append(r.dispatch[natNodePorts], xtables.Rule{Proto: s.proto,
				Matches: []xtables.Match{xtables.Comment(s.name), xtables.Port{Proto: s.proto, DPort: np}},
				Target:  xtables.Jump(s.extChain)})
		}
		if !s.hasExtern {
			t, c := filterTarget()
			r.dispatch[filterExternal] = append(r.dispatch[filterExternal], xtables.Rule{Proto: s.proto,
				Matches: []xtables.Match{xtables.Comment(c), xtables.AddrType{Dst: xtables.AddrTypeLocal}, xtables.Port{Proto: s.proto, DPort: np}},
				Target:  t})
		}
	}
	if hc := sp.Service.HealthCheckNodePort; hc != 0 {
		r.dispatch[filterNodePorts] = append(r.dispatch[filterNodePorts], xtables.Rule{Proto: xtables.ProtoTCP,
			Matches: []xtables.Match{xtables.Comment(s.name + " health check node port"), xtables.Port{Proto: xtables.ProtoTCP, DPort: hc}},
			Target:  xtables.Accept})
	}
}

// vipRule matches the port's traffic to one of its virtual addresses.
func (p *planner) vipRule(s *portState, a netip.Addr, comment string, t xtables.Target) xtables.Rule {
	return xtables.Rule{Dst: host(a), Proto: s.proto,
		Matches: []xtables.Match{xtables.Comment(comment), xtables.Port{Proto: s.proto, DPort: s.sp.Port.Port}},
		Target:  t}
}

// extRules fill the EXT chain: external traffic is masqueraded under the
// Cluster policy; under Local, traffic from pods and from the node itself
// takes the Cluster path (as if it went out to a load balancer and came
// back), and the rest keeps its source address.
func (p *planner) extRules(s *portState) []xtables.Rule {
	sp := s.sp
	var out []xtables.Rule
	markMasq := xtables.Jump(p.n.fixed(chainMarkMasq))
	if !sp.ExternalLocal {
		out = append(out, xtables.Rule{Matches: []xtables.Match{xtables.Comment("masquerade traffic for " + s.name + " external destinations")}, Target: markMasq})
	} else {
		if s.usesCluster {
			for _, c := range p.cidrs {
				out = append(out, xtables.Rule{Src: c, Matches: []xtables.Match{xtables.Comment("pod traffic for " + s.name + " external destinations")}, Target: xtables.Jump(p.n.svc(sp))})
			}
		}
		local := xtables.AddrType{Src: xtables.AddrTypeLocal}
		out = append(out, xtables.Rule{Matches: []xtables.Match{xtables.Comment("masquerade LOCAL traffic for " + s.name + " external destinations"), local}, Target: markMasq})
		if s.usesCluster {
			out = append(out, xtables.Rule{Matches: []xtables.Match{xtables.Comment("route LOCAL traffic for " + s.name + " external destinations"), local}, Target: xtables.Jump(p.n.svc(sp))})
		}
	}
	if s.hasExtern {
		out = append(out, xtables.Rule{Target: xtables.Jump(s.extPolicyChain)})
	}
	return out
}

// fwRules fill the FW chain: the source ranges and the node's own
// addresses go on to the EXT chain; other traffic is marked for
// PROXY-FIREWALL to drop.
func (p *planner) fwRules(s *portState) []xtables.Rule {
	sp := s.sp
	comment := xtables.Comment(s.name + " loadbalancer IP")
	ext := xtables.Jump(s.extChain)
	var out []xtables.Rule
	for _, r := range sp.SourceRanges {
		out = append(out, xtables.Rule{Src: r, Matches: []xtables.Match{comment}, Target: ext})
	}
	for _, a := range p.node.IPs(sp.Family) {
		out = append(out, xtables.Rule{Src: host(a), Matches: []xtables.Match{comment}, Target: ext})
	}
	for _, a := range sp.LoadBalancerIPs {
		out = append(out, xtables.Rule{Src: host(a), Matches: []xtables.Match{comment}, Target: ext})
	}
	return append(out, xtables.Rule{
		Matches: []xtables.Match{xtables.Comment("other traffic to " + s.name + " will be dropped by " + p.n.fixed(chainProxyFirewall))},
		Target:  xtables.Jump(p.n.fixed(chainMarkDrop))})
}

// policyRules fill an SVC or SVL chain: the masquerade rule for traffic
// to the cluster IP from outside the cluster, affinity checks, then one
// rule per backend, each taken with its share of the weight that remains.
// The SEP chains the rules jump to are added to seps.
func (p *planner) policyRules(s *portState, chain string, backends []servicelb.Backend, seps map[string]servicelb.Backend) []xtables.Rule {
	sp := s.sp
	var out []xtables.Rule
	if chain == s.internalChain && sp.ClusterIP.IsValid() {
		out = append(out, p.masqRules(s)...)
	}
	type ep struct {
		b       servicelb.Backend
		sep     string
		comment xtables.Comment
	}
	eps := make([]ep, len(backends))
	total := 0
	for i, b := range backends {
		eps[i] = ep{b, p.n.sep(sp, b), xtables.Comment(s.name + " -> " + b.String())}
		seps[eps[i].sep] = b
		total += int(b.Weight)
	}
	if sp.Affinity > 0 {
		for _, e := range eps {
			out = append(out, xtables.Rule{Matches: []xtables.Match{e.comment,
				xtables.Recent{Name: e.sep, Mode: xtables.RecentCheck, Seconds: affinitySeconds(sp), Reap: true}},
				Target: xtables.Jump(e.sep)})
		}
	}
	for i, e := range eps {
		r := xtables.Rule{Matches: []xtables.Match{e.comment}, Target: xtables.Jump(e.sep)}
		if i < len(eps)-1 {
			r.Matches = append(r.Matches, probability(int(e.b.Weight), total))
		}
		total -= int(e.b.Weight)
		out = append(out, r)
	}
	return out
}

func affinitySeconds(sp *servicelb.ServicePort) uint32 {
	return uint32(max(1, sp.Affinity.Milliseconds()/1000))
}

// probability returns the statistic match that takes weight w of the
// remaining total, computed from kube-proxy's "%0.10f" text as iptables
// would parse it.
func probability(w, total int) xtables.Statistic {
	f, _ := strconv.ParseFloat(fmt.Sprintf("%0.10f", float64(w)/float64(total)), 64)
	return xtables.Probability(f)
}

// masqRules mark traffic to the cluster IP for masquerade when it comes
// from outside the cluster CIDRs, or always with MasqueradeAll.
func (p *planner) masqRules(s *portState) []xtables.Rule {
	r := p.vipRule(s, s.sp.ClusterIP, s.name+" cluster IP", xtables.Jump(p.n.fixed(chainMarkMasq)))
	switch {
	case p.node.MasqueradeAll:
	case p.single:
		r.Src, r.NotSrc = p.cidrs[0], true
	case len(p.cidrs) > 1:
		r.Target = xtables.Jump(p.n.fixed(chainOffClusterMasq))
	default:
		return nil
	}
	return []xtables.Rule{r}
}

// sepRules fill a SEP chain: masquerade hairpin traffic (an endpoint
// reaching itself through its service), remember the client for
// affinity, and DNAT to the endpoint.
func (p *planner) sepRules(s *portState, chain string, b servicelb.Backend) []xtables.Rule {
	comment := xtables.Comment(s.name)
	dnat := xtables.Rule{Proto: s.proto, Matches: []xtables.Match{comment}, Target: xtables.DNAT{To: b.AddrPort()}}
	if s.sp.Affinity > 0 {
		dnat.Matches = append(dnat.Matches, xtables.Recent{Name: chain, Mode: xtables.RecentSet})
	}
	dnat.Matches = append(dnat.Matches, xtables.Port{Proto: s.proto})
	return []xtables.Rule{
		{Src: host(b.Addr), Matches: []xtables.Match{comment}, Target: xtables.Jump(p.n.fixed(chainMarkMasq))},
		dnat,
	}
}
