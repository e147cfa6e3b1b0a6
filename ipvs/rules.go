package ipvs

import (
	"fmt"

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

func maxChainSuffixLen() int { return len(chainSourceRange) }

// Rule is one helper rule: the table and chain it is appended to and its
// arguments in iptables-save syntax.
type Rule struct {
	Table string
	Chain string
	Args  []string
}

// ruleTable is one table's part of a family's helper rules.
type ruleTable struct {
	name string
	// chains are the owned chains, in order.
	chains []string
	// rules are appended to the owned chains.
	rules []Rule
	// jumps are appended to the built-in chains and enter the owned ones.
	jumps []Rule
}

// planRules returns the helper rules of one family. They do not depend on
// the services, only on the node: the sets carry the services.
func planRules(o *Options, node *servicelb.NodeConfig, f servicelb.Family) []ruleTable {
	n := names{o: o, f: f}
	mark := fmt.Sprintf("0x%x", node.MasqueradeMark())
	nat := ruleTable{name: "nat", chains: n.chains(chainServices, chainClusterIP, chainMarkMasq, chainPostrouting)}
	add := func(t *ruleTable, chain string, args ...string) {
		t.rules = append(t.rules, Rule{Table: t.name, Chain: n.chain(chain), Args: args})
	}
	jump := func(t *ruleTable, builtin, comment, target string) {
		t.jumps = append(t.jumps, Rule{Table: t.name, Chain: builtin,
			Args: []string{"-m", "comment", "--comment", comment, "-j", n.chain(target)}})
	}
	add(&nat, chainServices, n.match(setClusterIP, "dst,dst", "-j", n.chain(chainClusterIP))...)
	add(&nat, chainServices, n.match(setExternal, "dst,dst", "-j", n.chain(chainMarkMasq))...)
	switch cidrs := clusterCIDRs(node, f); {
	case node.MasqueradeAll:
		add(&nat, chainClusterIP, "-j", n.chain(chainMarkMasq))
	case len(cidrs) > 0:
		for _, c := range cidrs {
			add(&nat, chainClusterIP, "-s", c, "-j", "RETURN")
		}
		add(&nat, chainClusterIP, "-j", n.chain(chainMarkMasq))
	}
	add(&nat, chainMarkMasq, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	add(&nat, chainPostrouting, n.match(setLoopBack, "dst,dst,src", "-j", "MASQUERADE")...)
	add(&nat, chainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	add(&nat, chainPostrouting, "-j", "MARK", "--set-xmark", mark+"/0x0")
	add(&nat, chainPostrouting, "-j", "MASQUERADE", "--random-fully")
	jump(&nat, "PREROUTING", "kproxy-ipvs service portals", chainServices)
	jump(&nat, "OUTPUT", "kproxy-ipvs service portals", chainServices)
	jump(&nat, "POSTROUTING", "kproxy-ipvs postrouting rules", chainPostrouting)

	filter := ruleTable{name: "filter", chains: n.chains(chainInput, chainSourceRange, chainForward)}
	add(&filter, chainInput, n.match(setDrop, "dst,dst", "-j", "DROP")...)
	add(&filter, chainInput, n.match(setLBFirewall, "dst,dst", "-j", n.chain(chainSourceRange))...)
	for _, s := range []string{setClusterIP, setExternal, setExternalLocal} {
		add(&filter, chainInput, n.match(s, "dst,dst", "-j", "RETURN")...)
	}
	add(&filter, chainInput, append([]string{"-m", "conntrack", "--ctstate", "NEW"},
		n.match(setVIP, "dst", "-j", "REJECT", "--reject-with", rejectWith(f))...)...)
	add(&filter, chainSourceRange, n.match(setLBSource, "dst,dst,src", "-j", "RETURN")...)
	add(&filter, chainSourceRange, "-j", "DROP")
	add(&filter, chainForward, "-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	add(&filter, chainForward, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	jump(&filter, "INPUT", "kproxy-ipvs virtual address filter", chainInput)
	jump(&filter, "FORWARD", "kproxy-ipvs forwarding rules", chainForward)
	return []ruleTable{nat, filter}
}

// names builds the names of one family's sets and chains.
type names struct {
	o *Options
	f servicelb.Family
}

func (n names) chain(base string) string { return n.o.ChainPrefix + base }

func (n names) chains(bases ...string) []string {
	out := make([]string, len(bases))
	for i, b := range bases {
		out[i] = n.chain(b)
	}
	return out
}

func (n names) set(base string) string { return setName(n.o.SetPrefix, base, n.f) }

// match returns "-m set --match-set <set> <dirs>" followed by rest.
func (n names) match(set, dirs string, rest ...string) []string {
	return append([]string{"-m", "set", "--match-set", n.set(set), dirs}, rest...)
}

func rejectWith(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "icmp6-port-unreachable"
	}
	return "icmp-port-unreachable"
}

func clusterCIDRs(node *servicelb.NodeConfig, f servicelb.Family) []string {
	var out []string
	for _, p := range node.ClusterCIDRs {
		if servicelb.FamilyOf(p.Addr()) == f {
			out = append(out, p.String())
		}
	}
	return out
}
