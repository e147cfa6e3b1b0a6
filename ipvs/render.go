package ipvs

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Section headers of Render's text.
const (
	SectionIPVS      = "# ipvsadm -Sn"
	SectionAddresses = "# addresses of the dummy link"
	SectionSets      = "# ipset save"
	SectionRules4    = "# iptables-save"
	SectionRules6    = "# ip6tables-save"
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
		return "", err
	}
	caps, node := capabilities(), st.Node()
	if err := caps.CheckNode(&node); err != nil {
		return "", err
	}
	p, err := planState(st, &o)
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

// RenderVirtualServers formats virtual servers exactly as `ipvsadm -Sn`
// prints them, in its order: address virtual servers by family, protocol,
// address and port, then firewall-mark ones by mark and family. ipvsadm
// compares addresses by the sign of their 32-bit wrapped difference; the
// order is well defined (and equal to ipvsadm's) when the addresses of
// each protocol and family span less than half of the 32-bit space, as in
// any usual address plan.
func RenderVirtualServers(servers []*VirtualServer) string {
	vs := slices.Clone(servers)
	slices.SortFunc(vs, func(a, b *VirtualServer) int { return compareKeys(a.key(), b.key()) })
	slices.SortStableFunc(vs, compareIpvsadm)
	var b strings.Builder
	for _, v := range vs {
		writeVirtualServer(&b, v)
	}
	return b.String()
}

func writeVirtualServer(b *strings.Builder, vs *VirtualServer) {
	name := vs.key().String()
	fmt.Fprintf(b, "-A %s -s %s", name, vs.Scheduler)
	if vs.Persistence > 0 {
		fmt.Fprintf(b, " -p %d", vs.Persistence)
	}
	if vs.HashPort {
		fmt.Fprintf(b, " -b %s-port", vs.Scheduler)
	}
	b.WriteString("\n")
	real := slices.Clone(vs.Real)
	slices.SortStableFunc(real, func(x, y RealServer) int {
		return cmp.Or(compareWrapped(x.Addr, y.Addr), cmp.Compare(x.Port, y.Port))
	})
	for _, r := range real {
		fmt.Fprintf(b, "-a %s -r %s -m -w %d\n", name, r.AddrPort(), r.Weight)
	}
}

// compareIpvsadm orders virtual servers as ipvsadm does: by firewall mark
// (as a signed difference, none first), family, protocol number (IPVS
// gives firewall-mark ones TCP's), address and port.
func compareIpvsadm(a, b *VirtualServer) int {
	ap, bp := a.Protocol.Number(), b.Protocol.Number()
	if a.FWMark != 0 {
		ap = servicelb.TCP.Number()
	}
	if b.FWMark != 0 {
		bp = servicelb.TCP.Number()
	}
	return cmp.Or(cmp.Compare(int32(a.FWMark-b.FWMark), 0),
		cmp.Compare(a.family(), b.family()), cmp.Compare(ap, bp),
		compareWrapped(a.Addr, b.Addr), cmp.Compare(a.Port, b.Port))
}

// compareWrapped compares two addresses of one family 32 bits at a time,
// by the sign of the wrapped difference, as ipvsadm's sort does; invalid
// addresses (of firewall-mark virtual servers) are equal.
func compareWrapped(a, b netip.Addr) int {
	x, y := a.AsSlice(), b.AsSlice()
	for i := 0; i+4 <= len(x) && i+4 <= len(y); i += 4 {
		wx := uint32(x[i])<<24 | uint32(x[i+1])<<16 | uint32(x[i+2])<<8 | uint32(x[i+3])
		wy := uint32(y[i])<<24 | uint32(y[i+1])<<16 | uint32(y[i+2])<<8 | uint32(y[i+3])
		if d := int32(wx - wy); d != 0 {
			return cmp.Compare(d, 0)
		}
	}
	return 0
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
func renderRules(n ruleNames, node *servicelb.NodeConfig, p *statePlan) string {
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
