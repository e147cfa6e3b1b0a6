//go:build linux

package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Render returns the kernel state a Proxier with options o installs for
// st, as the text of the tools that show it, in sections: the IPVS table as
// `ipvsadm -Sn` prints it, the addresses of the dummy link, the helper sets
// as `ipset save` prints them (entries sorted), and the helper rules of
// each family as `iptables-save` prints them (only the proxier's chains and
// jumps). It needs no privileges and touches no kernel state.
func Render(st *servicelb.State, o Options) (string, error) {
	o, err := o.withDefaults()
	if err != nil {
		return "", fmt.Errorf("ipvs: %w", err)
	}
	caps, node := capabilities(&o), st.Node()
	if err := caps.CheckNode(&node); err != nil {
		return "", err
	}
	p, err := buildModel(st, &o)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintln(&b, SectionIPVS)
	b.WriteString(RenderVirtualServers(slices.Collect(maps.Values(p.servers))))
	fmt.Fprintln(&b, SectionAddresses, o.Interface)
	for _, a := range p.addresses() {
		fmt.Fprintln(&b, netip.PrefixFrom(a, a.BitLen()))
	}
	fmt.Fprintln(&b, SectionSets)
	b.WriteString(renderSets(&o, p.entries))
	fmt.Fprintln(&b, SectionRules4)
	b.WriteString(renderRules(ruleNames{o: &o, f: servicelb.IPv4}, &node, p))
	fmt.Fprintln(&b, SectionRules6)
	b.WriteString(renderRules(ruleNames{o: &o, f: servicelb.IPv6}, &node, p))
	return b.String(), nil
}

// renderSets formats the helper sets as `ipset save` prints them, entries
// sorted.
func renderSets(o *Options, entries map[setEntry]int) string {
	bySet := map[string][]setEntry{}
	for e := range entries {
		name := setName(o.SetPrefix, e.set, e.family)
		bySet[name] = append(bySet[name], e)
	}
	var b strings.Builder
	for _, f := range []servicelb.Family{servicelb.IPv4, servicelb.IPv6} {
		for _, s := range setSpecs() {
			name := setName(o.SetPrefix, s.base, f)
			fmt.Fprintf(&b, "create %s %s family %s\n", name, s.typ, ipsetFamily(f))
			es := bySet[name]
			slices.SortFunc(es, compareEntries)
			for _, e := range es {
				fmt.Fprintf(&b, "add %s %s\n", name, e)
			}
		}
	}
	return b.String()
}

func ipsetFamily(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "inet6"
	}
	return "inet"
}

// renderRules formats one family's helper rules as iptables-nft-save
// prints them in a namespace where they are the only rules.
func renderRules(n ruleNames, node *servicelb.NodeConfig, p *model) string {
	tables := planRules(n, node, p.steerRules(n.f))
	var b []byte
	for _, name := range []xtables.TableName{xtables.NAT, xtables.Filter, xtables.Mangle} {
		for t, c := range tables {
			if t.Name == name {
				b = xtables.AppendSaveTable(b, t.Family, c.Text(name))
			}
		}
	}
	return string(b)
}
