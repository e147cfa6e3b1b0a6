//go:build linux

package nftables

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// render writes the table as nft text that `nft -f` loads.
func (c *content) render(table string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", table)
	for _, d := range c.sets {
		renderSet(d, c.elems[d.id], &b)
	}
	for _, ch := range c.chains {
		fmt.Fprintf(&b, "\tchain %s {\n", ch.name)
		if h := ch.hook; h != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", h.Type, hookName(h.Num), h.Priority)
		}
		for _, r := range ch.rules {
			fmt.Fprintf(&b, "\t\t%s\n", r.text)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func hookName(n uint32) string {
	switch n {
	case nfnl.HookPrerouting:
		return "prerouting"
	case nfnl.HookInput:
		return "input"
	case nfnl.HookForward:
		return "forward"
	case nfnl.HookOutput:
		return "output"
	case nfnl.HookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", n)
}

// renderSet writes a set declaration with its elements. An element of a
// backends map, whose hash range alone says nothing of the service it
// serves, is followed by a comment naming its service port.
func renderSet(d setDef, parts []elemPart, b *strings.Builder) {
	kind := "set"
	if d.set.Flags&nfnl.SetMap != 0 {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s\n", kind, d.set.Name, d.decl)
	var es []elem
	owner := map[string]string{} // a backends element's key: its service port
	for _, p := range parts {
		es = append(es, p.es...)
		if k, ok := p.owner.(servicelb.ServicePortKey); ok && d.id.kind() == kindBackends {
			for _, e := range p.es {
				owner[string(e.key)] = k.String()
			}
		}
	}
	texts, starts := elemTexts(d.id, es)
	if len(texts) > 0 {
		b.WriteString("\t\telements = { ")
		for i, t := range texts {
			b.WriteString(t)
			last := i == len(texts)-1
			if last {
				b.WriteString(" }")
			} else {
				b.WriteString(",")
			}
			if o := owner[string(starts[i].key)]; o != "" {
				b.WriteString("\t# " + o)
			}
			if !last {
				b.WriteString("\n\t\t\t     ")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\t}\n")
}

// elemTexts renders a set's elements as nft writes them, with the element
// each text starts at. Interval sets turn pairs of start and end elements
// into ranges and prefixes.
func elemTexts(id setID, es []elem) ([]string, []elem) {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b elem) int {
		return cmp.Or(bytes.Compare(a.key, b.key), cmp.Compare(b.flags, a.flags))
	})
	f := id.family()
	al := addrLen(f)
	var out []string
	var starts []elem
	for i, e := range es {
		if e.flags&nfnl.ElemIntervalEnd != 0 {
			continue
		}
		switch id.kind() {
		case kindServices:
			if v, ok := strings.CutPrefix(e.chain, "!"); ok {
				out = append(out, entryText(e.key, al)+" : "+v) // another verdict than the proxier's goto
				break
			}
			out = append(out, entryText(e.key, al)+" : goto "+e.chain)
		case kindFirewall:
			out = append(out, entryText(e.key, al))
		case kindClusterIPs:
			out = append(out, addrAt(e.key).String())
		case kindFirewallPass:
			out = append(out, entryText(e.key, al)+" . "+rangeText(addrAt(e.key[al+8:]), addrAt(e.keyEnd[al+8:])))
		case kindHairpin:
			out = append(out, addrAt(e.key[:al]).String()+" . "+addrAt(e.key[al:]).String())
		case kindPodCIDRs, kindServiceCIDRs:
			out = append(out, rangeText(addrAt(e.key), lastBefore(es, i, f)))
		case kindBackends:
			lo := binary.BigEndian.Uint32(e.key)
			hi := lo + buckets - 1
			if i+1 < len(es) {
				hi = binary.BigEndian.Uint32(es[i+1].key) - 1
			}
			out = append(out, fmt.Sprintf("%d-%d : %s . %d", lo, hi, addrAt(e.data[:al]), binary.BigEndian.Uint16(e.data[al:])))
		}
		if len(out) > len(starts) {
			starts = append(starts, e)
		}
	}
	return out, starts
}

// lastBefore returns the last address of the interval starting at es[i]:
// one before the end element that follows it, or the family's last address.
func lastBefore(es []elem, i int, f servicelb.Family) netip.Addr {
	if i+1 < len(es) && es[i+1].flags&nfnl.ElemIntervalEnd != 0 {
		return addrAt(es[i+1].key).Prev()
	}
	if f == servicelb.IPv6 {
		return netip.IPv6Unspecified().Prev()
	}
	return netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

func addrAt(b []byte) netip.Addr {
	a, _ := netip.AddrFromSlice(b)
	return a
}

// entryText renders "addr . proto . port" from an entry key.
func entryText(k []byte, al int) string {
	proto := servicelb.Protocol("")
	switch k[al] {
	case 6:
		proto = servicelb.TCP
	case 17:
		proto = servicelb.UDP
	case 132:
		proto = servicelb.SCTP
	}
	return addrAt(k[:al]).String() + " . " + proto.Lower() + " . " + strconv.Itoa(int(binary.BigEndian.Uint16(k[al+4:])))
}

// rangeText renders an address range as a single address, a prefix, or
// "first-last".
func rangeText(first, last netip.Addr) string {
	if first == last {
		return first.String()
	}
	for bits := first.BitLen() - 1; bits >= 0; bits-- {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() == first && lastAddr(p) == last {
			return p.String()
		}
	}
	return first.String() + "-" + last.String()
}

// Render returns the table a Proxier with options o would write for st,
// as nft text that `nft -f` loads. It opens no socket and needs no
// privileges: for dry runs, and to look at a state from any machine.
func Render(st *servicelb.State, o Options) (string, error) {
	p, err := newProxier(o)
	if err != nil {
		return "", err
	}
	return p.Render(st)
}
