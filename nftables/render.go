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

// renderSet writes a set declaration with its elements.
func renderSet(d setDef, parts []elemPart, b *strings.Builder) {
	kind := "set"
	if d.set.Flags&nfnl.SetMap != 0 {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s\n", kind, d.set.Name, d.decl)
	var es []elem
	for _, p := range parts {
		es = append(es, p.es...)
	}
	texts := elemTexts(d.id, es)
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
			if !last {
				b.WriteString("\n\t\t\t     ")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\t}\n")
}

// elemTexts renders a set's elements as nft writes them. Interval sets
// turn pairs of start and end elements into ranges and prefixes.
func elemTexts(id setID, es []elem) []string {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b elem) int {
		return cmp.Or(bytes.Compare(a.key, b.key), cmp.Compare(b.flags, a.flags))
	})
	f := id.family()
	al := addrLen(f)
	var out []string
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
		case kindFirewall, kindShape, kindBuckets:
			out = append(out, entryText(e.key, al))
		case kindEndpoints:
			out = append(out, fmt.Sprintf("%s . %d : %s . %d", entryText(e.key, al), binary.NativeEndian.Uint32(e.key[al+8:]),
				addrAt(e.data[:al]), binary.BigEndian.Uint16(e.data[al:])))
		case kindProtocols:
			out = append(out, protocolOf(e.key[0]).Lower())
		case kindClusterIPs:
			out = append(out, addrAt(e.key).String())
		case kindFirewallPass:
			out = append(out, entryText(e.key, al)+" . "+rangeText(addrAt(e.key[al+8:]), addrAt(e.keyEnd[al+8:])))
		case kindHairpin:
			out = append(out, addrAt(e.key[:al]).String()+" . "+addrAt(e.key[al:]).String())
		case kindPodCIDRs, kindServiceCIDRs:
			out = append(out, rangeText(addrAt(e.key), lastBefore(es, i, f)))
		}
	}
	return out
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
	return addrAt(k[:al]).String() + " . " + protocolOf(k[al]).Lower() + " . " + strconv.Itoa(int(binary.BigEndian.Uint16(k[al+4:])))
}

// protocolOf returns the protocol of an IP protocol number.
func protocolOf(n byte) servicelb.Protocol {
	switch n {
	case 6:
		return servicelb.TCP
	case 17:
		return servicelb.UDP
	case 132:
		return servicelb.SCTP
	}
	return ""
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
