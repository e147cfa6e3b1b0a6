package ipvs

import (
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The helper chains, by base name, named <ChainPrefix><base>.
const (
	chainServices    = "SERVICES"      // nat, from PREROUTING and OUTPUT
	chainClusterIP   = "CLUSTER-IP"    // nat: masquerade traffic to cluster IPs from outside
	chainMarkMasq    = "MARK-MASQ"     // nat: tag for masquerade
	chainPostrouting = "POSTROUTING"   // nat, from POSTROUTING
	chainInput       = "INPUT"         // filter, from INPUT
	chainSourceRange = "SOURCE-RANGES" // filter: load-balancer source ranges
	chainForward     = "FORWARD"       // filter, from FORWARD
)

func chainBases() []string {
	return []string{chainServices, chainClusterIP, chainMarkMasq, chainPostrouting, chainInput, chainSourceRange, chainForward}
}

func maxChainSuffixLen() int { return len(chainSourceRange) }

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

var (
	dst     = xtables.SetDst
	src     = xtables.SetSrc
	comment = func(s string) xtables.Match { return xtables.Comment(s) }
)

// planRules returns one family's helper rules by table. They depend on the
// node only: the sets carry the services, so their number stays the same
// however many services there are.
func planRules(n ruleNames, node *servicelb.NodeConfig) map[xtables.Table]*xtables.TableContent {
	mark := node.MasqueradeMark()
	fam := xtables.IPv4
	if n.f == servicelb.IPv6 {
		fam = xtables.IPv6
	}
	rule := func(t xtables.Target, m ...xtables.Match) xtables.Rule { return xtables.Rule{Matches: m, Target: t} }
	jump := func(c string) xtables.Target { return xtables.Jump(n.chain(c)) }
	nat := &xtables.TableContent{
		Jumps: map[string][]xtables.Rule{
			"PREROUTING":  {rule(jump(chainServices), comment("kproxy-ipvs service portals"))},
			"OUTPUT":      {rule(jump(chainServices), comment("kproxy-ipvs service portals"))},
			"POSTROUTING": {rule(jump(chainPostrouting), comment("kproxy-ipvs postrouting rules"))},
		},
		Chains: map[string][]xtables.Rule{
			n.chain(chainServices): {
				rule(jump(chainClusterIP), n.match(setClusterIP, dst, dst)),
				rule(jump(chainMarkMasq), n.match(setExternal, dst, dst)),
			},
			n.chain(chainClusterIP): clusterIPRules(n, node),
			n.chain(chainMarkMasq):  {rule(xtables.OrMark(mark))},
			n.chain(chainPostrouting): {
				rule(xtables.Masquerade{}, n.match(setLoopBack, dst, dst, src)),
				rule(xtables.Return, xtables.Mark{Value: mark, Mask: mark, Invert: true}),
				rule(xtables.XorMark(mark)),
				rule(xtables.Masquerade{RandomFully: true}),
			},
		},
	}
	filter := &xtables.TableContent{
		Jumps: map[string][]xtables.Rule{
			"INPUT":   {rule(jump(chainInput), comment("kproxy-ipvs virtual address filter"))},
			"FORWARD": {rule(jump(chainForward), comment("kproxy-ipvs forwarding rules"))},
		},
		Chains: map[string][]xtables.Rule{
			n.chain(chainInput): {
				rule(xtables.Drop, n.match(setDrop, dst, dst)),
				rule(jump(chainSourceRange), n.match(setLBFirewall, dst, dst)),
				rule(xtables.Return, n.match(setClusterIP, dst, dst)),
				rule(xtables.Return, n.match(setExternal, dst, dst)),
				rule(xtables.Return, n.match(setExternalLocal, dst, dst)),
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
	return map[xtables.Table]*xtables.TableContent{
		{Family: fam, Name: xtables.NAT}:    nat,
		{Family: fam, Name: xtables.Filter}: filter,
	}
}

// clusterIPRules masquerade traffic to cluster IPs that comes from outside
// the cluster CIDRs, or all of it with MasqueradeAll, or none when the
// node knows no cluster CIDR of the family.
func clusterIPRules(n ruleNames, node *servicelb.NodeConfig) []xtables.Rule {
	masq := xtables.Rule{Target: xtables.Jump(n.chain(chainMarkMasq))}
	if node.MasqueradeAll {
		return []xtables.Rule{masq}
	}
	var out []xtables.Rule
	for _, p := range node.ClusterCIDRs {
		if servicelb.FamilyOf(p.Addr()) == n.f {
			out = append(out, xtables.Rule{Src: p, Target: xtables.Return})
		}
	}
	if len(out) == 0 {
		return nil
	}
	return append(out, masq)
}

// ownsChain reports whether a chain is one of the helper chains of prefix.
func ownsChain(prefix string) func(xtables.TableName, string) bool {
	own := map[string]bool{}
	for _, b := range chainBases() {
		own[prefix+b] = true
	}
	return func(_ xtables.TableName, chain string) bool { return own[chain] }
}

// allRules returns both families' helper rules.
func allRules(o *Options, node *servicelb.NodeConfig, index func(string) uint16) map[xtables.Table]*xtables.TableContent {
	out := map[xtables.Table]*xtables.TableContent{}
	for _, f := range families() {
		for t, c := range planRules(ruleNames{o: o, f: f, index: index}, node) {
			out[t] = c
		}
	}
	return out
}

// ruleTables are the tables the helper rules live in.
func ruleTables() []xtables.Table {
	var out []xtables.Table
	for _, f := range []xtables.Family{xtables.IPv4, xtables.IPv6} {
		out = append(out, xtables.Table{Family: f, Name: xtables.NAT}, xtables.Table{Family: f, Name: xtables.Filter})
	}
	return out
}
