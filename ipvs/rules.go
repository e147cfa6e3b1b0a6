//go:build linux

package ipvs

import (
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The helper chains, by base name, named <ChainPrefix><base>.
const (
	chainServices    = "SERVICES"      // nat, from PREROUTING and OUTPUT: masquerade by origin
	chainMarkMasq    = "MARK-MASQ"     // nat: tag for masquerade
	chainPostrouting = "POSTROUTING"   // nat, from POSTROUTING
	chainInput       = "INPUT"         // filter, from INPUT
	chainSourceRange = "SOURCE-RANGES" // filter: load-balancer source ranges
	chainForward     = "FORWARD"       // filter, from FORWARD
	chainPrerouting  = "PREROUTING"    // mangle, from PREROUTING: flows arriving
	chainOutput      = "OUTPUT"        // mangle, from OUTPUT: the node's flows
	chainLocal       = "LOCAL"         // mangle: origin of the node's flows
	chainFromPod     = "FROM-POD"      // mangle, keyed by port: steers of pods' flows
	chainFromNode    = "FROM-NODE"     // mangle, keyed by port: steers of the node's flows
)

func chainBases() []string {
	return []string{chainServices, chainMarkMasq, chainPostrouting, chainInput, chainSourceRange, chainForward,
		chainPrerouting, chainOutput, chainLocal, chainFromPod, chainFromNode}
}

func maxChainSuffixLen() int { return len(chainSourceRange) }

// steerChains are the keyed chains, by originChain index.
var steerChains = [2]string{chainFromPod, chainFromNode}

// ruleNames builds one family's set and chain names and set matches.
type ruleNames struct {
	o *Options
	f servicelb.Family
	// index returns a set's kernel index; nil renders without indexes.
	index func(id string) uint16
}

func (n ruleNames) chain(base string) string { return n.o.ChainPrefix + base }

// match returns the set match of a helper set in the given directions.
func (n ruleNames) match(base string, dirs ...xtables.SetDir) xtables.Set {
	id := setID(base, n.f)
	s := xtables.Set{Name: n.o.SetPrefix + id, Dirs: dirs}
	if n.index != nil {
		s.Index = n.index(id)
	}
	return s
}

func (n ruleNames) family() xtables.Family {
	if n.f == servicelb.IPv6 {
		return xtables.IPv6
	}
	return xtables.IPv4
}

var (
	dst      = xtables.SetDst
	src      = xtables.SetSrc
	comment  = func(s string) xtables.Match { return xtables.Comment(s) }
	localSrc = xtables.AddrType{Src: xtables.AddrTypeLocal}
)

func rule(t xtables.Target, m ...xtables.Match) xtables.Rule {
	return xtables.Rule{Matches: m, Target: t}
}

// planRules returns one family's helper rules by table: those of the
// node, whose number does not depend on the services (the sets carry
// them), and the steers of the ports in the keyed chains, keys to rules.
func planRules(n ruleNames, node *servicelb.NodeConfig, steers [2]map[string][]xtables.Rule) map[xtables.Table]*xtables.TableContent {
	fam := n.family()
	mangle := mangleRules(n, node)
	mangle.Keyed = map[string]map[string][]xtables.Rule{}
	for i, c := range steerChains {
		keys := steers[i]
		if keys == nil {
			keys = map[string][]xtables.Rule{}
		}
		mangle.Keyed[n.chain(c)] = keys
	}
	return map[xtables.Table]*xtables.TableContent{
		{Family: fam, Name: xtables.NAT}:    natRules(n, node),
		{Family: fam, Name: xtables.Filter}: filterRules(n, node),
		{Family: fam, Name: xtables.Mangle}: mangle,
	}
}

// natRules masquerade by origin (pod: as the node's local-traffic
// detection recognises it; node: a local source; else outside), as the
// masquerade sets list the frontends, and hairpin flows.
func natRules(n ruleNames, node *servicelb.NodeConfig) *xtables.TableContent {
	mark := node.MasqueradeMark()
	jump := func(c string) xtables.Target { return xtables.Jump(n.chain(c)) }
	masq := jump(chainMarkMasq)
	services := []xtables.Rule{rule(masq, n.match(setMasq, dst, dst))}
	masqPod, podReturn := xtables.Pods(xtables.Local(node.LocalMatch(n.f)), rule(masq, n.match(setMasqPod, dst, dst))),
		xtables.Pods(xtables.Local(node.LocalMatch(n.f)), rule(xtables.Return))
	for i := range masqPod {
		services = append(services, masqPod[i], podReturn[i])
	}
	services = append(services,
		rule(masq, localSrc, n.match(setMasqNode, dst, dst)),
		rule(xtables.Return, localSrc),
		rule(masq, n.match(setMasqOutside, dst, dst)))
	return &xtables.TableContent{
		Jumps: map[string][]xtables.Rule{
			"PREROUTING":  {rule(jump(chainServices), comment("kproxy-ipvs service portals"))},
			"OUTPUT":      {rule(jump(chainServices), comment("kproxy-ipvs service portals"))},
			"POSTROUTING": {rule(jump(chainPostrouting), comment("kproxy-ipvs postrouting rules"))},
		},
		Chains: map[string][]xtables.Rule{
			n.chain(chainServices): services,
			n.chain(chainMarkMasq): {rule(xtables.OrMark(mark))},
			n.chain(chainPostrouting): {
				rule(xtables.Masquerade{}, n.match(setLoopBack, dst, dst, src)),
				rule(xtables.Return, xtables.Mark{Value: mark, Mask: mark, Invert: true}),
				rule(xtables.XorMark(mark)),
				rule(xtables.Masquerade{RandomFully: true}),
			},
		},
	}
}

// filterRules let in the frontends' flows from allowed sources and reject
// new flows to other ports of virtual addresses.
func filterRules(n ruleNames, node *servicelb.NodeConfig) *xtables.TableContent {
	jump := func(c string) xtables.Target { return xtables.Jump(n.chain(c)) }
	mark := node.MasqueradeMark()
	return &xtables.TableContent{
		Jumps: map[string][]xtables.Rule{
			"INPUT":   {rule(jump(chainInput), comment("kproxy-ipvs virtual address filter"))},
			"FORWARD": {rule(jump(chainForward), comment("kproxy-ipvs forwarding rules"))},
		},
		Chains: map[string][]xtables.Rule{
			n.chain(chainInput): {
				rule(jump(chainSourceRange), n.match(setLBFirewall, dst, dst)),
				rule(xtables.Return, n.match(setFrontends, dst, dst)),
				rule(xtables.Reject{}, xtables.Conntrack{States: xtables.CtNew}, n.match(setVIP, dst)),
			},
			n.chain(chainSourceRange): {
				rule(xtables.Return, n.match(setLBSource, dst, dst, src)),
				rule(xtables.Drop),
			},
			n.chain(chainForward): {
				rule(xtables.Accept, xtables.Mark{Value: mark, Mask: mark}),
				rule(xtables.Accept, xtables.Conntrack{States: xtables.CtRelated | xtables.CtEstablished}),
			},
		},
	}
}

// mangleRules run before routing, IPVS and NAT: they drop flows to
// unallocated service addresses, check the node's flows against source
// ranges (IPVS takes them before the filter table sees them), steer the
// flows of pods and of the node whose verdicts differ from the outside
// verdict with the marks of the keyed chains, and drop what a drop
// verdict leaves unmarked.
func mangleRules(n ruleNames, node *servicelb.NodeConfig) *xtables.TableContent {
	jump := func(c string) xtables.Target { return xtables.Jump(n.chain(c)) }
	unmarked := xtables.Mark{Value: 0, Mask: n.o.FWMarkMask}
	drop := rule(xtables.Drop, n.match(setDrop, dst, dst), unmarked)
	var pre, out, classify []xtables.Rule
	for _, p := range node.DroppedServiceCIDRs(n.f) {
		r := rule(xtables.Drop, xtables.AddrType{Dst: xtables.AddrTypeLocal, NotDst: true}, xtables.Conntrack{States: xtables.CtNew})
		r.Dst = p
		pre, out = append(pre, r), append(out, r)
	}
	out = append(out, rule(xtables.Drop, n.match(setLBFirewall, dst, dst), invert(n.match(setLBSource, dst, dst, src))))
	// The pods' flows arrive, as the detection recognises them. The
	// node's own flows are a pod's when the detection goes by source and
	// their source is in its prefixes; they come in on no interface, so an
	// interface detection never claims them. LOCAL goes to one origin's
	// chain, whose end returns to OUTPUT (LOCAL was jumped to), so that no
	// flow takes two origins' steers and every one meets the drop rule
	// after them.
	pods := xtables.Local(node.LocalMatch(n.f))
	pre = append(pre, xtables.Pods(pods, rule(jump(chainFromPod)))...)
	if pods.Interface == "" {
		classify = append(classify, xtables.Pods(pods, rule(xtables.Goto(n.chain(chainFromPod))))...)
	}
	classify = append(classify, rule(xtables.Goto(n.chain(chainFromNode))))
	return &xtables.TableContent{
		Jumps: map[string][]xtables.Rule{
			"PREROUTING": {rule(jump(chainPrerouting), comment("kproxy-ipvs arriving flows"))},
			"OUTPUT":     {rule(jump(chainOutput), comment("kproxy-ipvs flows of the node"))},
		},
		Chains: map[string][]xtables.Rule{
			n.chain(chainPrerouting): append(pre, drop),
			n.chain(chainOutput):     append(out, rule(jump(chainLocal)), drop),
			n.chain(chainLocal):      classify,
		},
	}
}

func invert(s xtables.Set) xtables.Set {
	s.Invert = true
	return s
}

// steerRules returns the rules of the plan's ports of family f in the
// keyed chains, by chain and port.
func (p *model) steerRules(f servicelb.Family) [2]map[string][]xtables.Rule {
	out := [2]map[string][]xtables.Rule{{}, {}}
	for k, pp := range p.ports {
		if k.Family != f {
			continue
		}
		for i, rules := range pp.rules {
			if len(rules) > 0 {
				out[i][k.String()] = rules
			}
		}
	}
	return out
}

// allRules returns both families' helper rules.
func allRules(o *Options, node *servicelb.NodeConfig, index func(string) uint16, p *model) map[xtables.Table]*xtables.TableContent {
	out := map[xtables.Table]*xtables.TableContent{}
	for _, f := range families() {
		for t, c := range planRules(ruleNames{o: o, f: f, index: index}, node, p.steerRules(f)) {
			out[t] = c
		}
	}
	return out
}

// ownsChain reports whether a chain is one of the helper chains of prefix.
func ownsChain(prefix string) func(xtables.TableName, string) bool {
	own := map[string]bool{}
	for _, b := range chainBases() {
		own[prefix+b] = true
	}
	return func(_ xtables.TableName, chain string) bool { return own[chain] }
}

// ruleTables are the tables the helper rules live in.
func ruleTables() []xtables.Table {
	var out []xtables.Table
	for _, f := range []xtables.Family{xtables.IPv4, xtables.IPv6} {
		for _, t := range []xtables.TableName{xtables.NAT, xtables.Filter, xtables.Mangle} {
			out = append(out, xtables.Table{Family: f, Name: t})
		}
	}
	return out
}
