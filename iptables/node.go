//go:build linux

package iptables

import (
	"net/netip"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// nodeRules are the rules of one family that do not belong to a service
// port: the fixed chains, the tails of the dispatch chains, and the jumps
// from the builtin chains.
type nodeRules struct {
	// chains are whole fixed chains, by table.
	chains map[xtables.TableName][]xtables.Chain
	tails  [numDispatch][]xtables.Rule
	// jumps are the rules at the top of builtin chains, by table and chain.
	jumps map[xtables.TableName]map[string][]xtables.Rule
}

func jumpRule(comment string, chain string, ctNew bool) xtables.Rule {
	r := xtables.Rule{Matches: []xtables.Match{xtables.Comment(comment)}, Target: xtables.Jump(chain)}
	if ctNew {
		r.Matches = append([]xtables.Match{xtables.Conntrack{States: xtables.CtNew}}, r.Matches...)
	}
	return r
}

// nodeRules builds the node's rules for the planner's family. The jumps
// are kube-proxy's, in the order kube-proxy leaves them at the top of the
// builtin chains.
func (p *planner) nodeRules() nodeRules {
	n := p.n
	masq := xtables.Mark{Value: p.masq, Mask: p.masq}
	nr := nodeRules{
		chains: map[xtables.TableName][]xtables.Chain{},
		jumps:  map[xtables.TableName]map[string][]xtables.Rule{},
	}
	nat := []xtables.Chain{
		{Name: n.fixed(chainPostrouting), Rules: []xtables.Rule{
			{Matches: []xtables.Match{xtables.Mark{Value: p.masq, Mask: p.masq, Invert: true}}, Target: xtables.Return},
			{Target: xtables.XorMark(p.masq)},
			{Matches: []xtables.Match{xtables.Comment("kubernetes service traffic requiring SNAT")}, Target: xtables.Masquerade{RandomFully: true}},
		}},
		{Name: n.fixed(chainMarkMasq), Rules: []xtables.Rule{{Target: xtables.OrMark(p.masq)}}},
		{Name: n.fixed(chainMarkDrop), Rules: []xtables.Rule{{Target: xtables.OrMark(p.drop)}}},
	}
	if _, ok := xtables.NotPods(xtables.Local(p.pods), xtables.Rule{}); !ok && p.pods.Detects() {
		rules := xtables.Pods(xtables.Local(p.pods), xtables.Rule{Target: xtables.Return})
		rules = append(rules, xtables.Rule{Target: xtables.Jump(n.fixed(chainMarkMasq))})
		nat = append(nat, xtables.Chain{Name: n.fixed(chainOffClusterMasq), Rules: rules})
	}
	nr.chains[xtables.NAT] = nat
	var forward []xtables.Rule
	if !p.liberal {
		forward = append(forward, xtables.Rule{Matches: []xtables.Match{xtables.Conntrack{States: xtables.CtInvalid}}, Target: xtables.Drop})
	}
	forward = append(forward,
		xtables.Rule{Matches: []xtables.Match{xtables.Comment("kubernetes forwarding rules"), masq}, Target: xtables.Accept},
		xtables.Rule{Matches: []xtables.Match{xtables.Comment("kubernetes forwarding conntrack rule"), xtables.Conntrack{States: xtables.CtRelated | xtables.CtEstablished}}, Target: xtables.Accept})
	nr.chains[xtables.Filter] = []xtables.Chain{
		{Name: n.fixed(chainForward), Rules: forward},
		{Name: n.fixed(chainProxyFirewall), Rules: []xtables.Rule{
			{Matches: []xtables.Match{xtables.Comment("drop traffic to load balancer IPs refused by their source ranges"), xtables.Mark{Value: p.drop, Mask: p.drop}}, Target: xtables.Drop},
		}},
	}
	for _, a := range p.nodePortIPs {
		nr.tails[natServices] = append(nr.tails[natServices], xtables.Rule{Dst: host(a),
			Matches: []xtables.Match{xtables.Comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")},
			Target:  xtables.Jump(n.fixed(chainNodePorts))})
	}
	for _, c := range p.node.DroppedServiceCIDRs(p.family) {
		nr.tails[filterServices] = append(nr.tails[filterServices], xtables.Rule{Dst: c,
			Matches: []xtables.Match{xtables.Comment("drop traffic to unallocated cluster IPs")},
			Target:  xtables.Drop})
	}
	portals := "kubernetes service portals"
	external := "kubernetes externally-visible service portals"
	lbFirewall := "kubernetes load balancer firewall"
	nr.jumps[xtables.NAT] = map[string][]xtables.Rule{
		"PREROUTING":  {jumpRule(portals, n.fixed(chainServices), false)},
		"OUTPUT":      {jumpRule(portals, n.fixed(chainServices), false)},
		"POSTROUTING": {jumpRule("kubernetes postrouting rules", n.fixed(chainPostrouting), false)},
	}
	nr.jumps[xtables.Filter] = map[string][]xtables.Rule{
		"INPUT": {
			jumpRule(lbFirewall, n.fixed(chainProxyFirewall), true),
			jumpRule("kubernetes health check service ports", n.fixed(chainNodePorts), false),
			jumpRule(external, n.fixed(chainExternalServices), true),
		},
		"FORWARD": {
			jumpRule(lbFirewall, n.fixed(chainProxyFirewall), true),
			jumpRule("kubernetes forwarding rules", n.fixed(chainForward), false),
			jumpRule(portals, n.fixed(chainServices), true),
			jumpRule(external, n.fixed(chainExternalServices), true),
		},
		// The node's own flows to external and load-balancer IPs are
		// rejected or dropped as everyone's are (kube-proxy's iptables
		// mode sends them on; its nftables mode does not).
		"OUTPUT": {
			jumpRule(lbFirewall, n.fixed(chainProxyFirewall), true),
			jumpRule(portals, n.fixed(chainServices), true),
			jumpRule(external, n.fixed(chainExternalServices), true),
		},
	}
	if p.family == servicelb.IPv4 && p.node.ServesLocalhost() {
		p.localhostFirewall(&nr)
	}
	return nr
}

// loopback4 is IPv4's loopback network.
var loopback4 = netip.MustParsePrefix("127.0.0.0/8")

// localhostFirewall adds kube-proxy's guard for node ports on localhost:
// with route_localnet set, the kernel would route packets to 127.0.0.0/8
// that arrive from other hosts; the filter table drops those that are not
// part of a flow the node started (or translated).
func (p *planner) localhostFirewall(nr *nodeRules) {
	fw := p.n.fixed(chainLocalnet)
	nr.chains[xtables.Filter] = append(nr.chains[xtables.Filter], xtables.Chain{Name: fw, Rules: []xtables.Rule{{
		Src: loopback4, NotSrc: true, Dst: loopback4,
		Matches: []xtables.Match{xtables.Comment("block incoming localnet connections"),
			xtables.Conntrack{States: xtables.CtRelated | xtables.CtEstablished | xtables.CtDNAT, Invert: true}},
		Target: xtables.Drop,
	}}})
	for _, builtin := range []string{"INPUT", "OUTPUT"} {
		nr.jumps[xtables.Filter][builtin] = append(nr.jumps[xtables.Filter][builtin], xtables.Rule{Target: xtables.Jump(fw)})
	}
}
