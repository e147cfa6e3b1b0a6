package nftables

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The table's named sets and maps: a fixed list per family, plus the
// backends maps (shards of them per family). Their number does not grow
// with the number of services.
const (
	setServices     = "services"       // entry -> goto svc/ext chain
	setNoEndpoints  = "no-endpoints"   // entries of ports without endpoints
	setFirewall     = "firewall"       // load-balancer entries with source ranges
	setFirewallPass = "firewall-allow" // entry . allowed source range
	setHairpin      = "hairpin"        // endpoint . endpoint
	setClusterCIDRs = "cluster-cidrs"  // NodeConfig.ClusterCIDRs
	setServiceCIDRs = "service-cidrs"  // NodeConfig.ServiceCIDRs
	setAffinity     = "affinity"       // client . slot . endpoint, dynamic
)

// setDef is a set's definition, for the kernel and for nft text.
type setDef struct {
	set  nfnl.Set
	decl string // the "type ...; flags ..." lines of its nft declaration
}

func setName(base string, f servicelb.Family) string { return base + fam(f) }

// udata builds nft's set user data: type-length-value records (one byte
// each for type and length, values in host byte order) through which nft
// learns a key's byte order and "typeof" expressions. kproxy writes what
// nft itself writes for the same declaration, so that nft lists the sets
// exactly as it would list its own.
type udata []byte

// Record types (libnftnl's NFTNL_UDATA_SET_*) and nft's expression type
// numbers used in "typeof" records.
const (
	udKeyByteOrder  = 0
	udDataByteOrder = 1
	udKeyTypeof     = 3
	udDataTypeof    = 4
	udDataInterval  = 6
	udExprPayload   = 7
	udExprConcat    = 13
	udExprNumgen    = 23
	byteOrderHost   = 1
	byteOrderBig    = 2
	protoDescIP     = 12
	protoDescIP6    = 13
	protoDescTH     = 11
	fieldIPSaddr    = 11
	fieldIPDaddr    = 12
	fieldIP6Saddr   = 8
	fieldIP6Daddr   = 9
	fieldTHDport    = 2
)

func (u udata) u32(t byte, v uint32) udata {
	return binary.LittleEndian.AppendUint32(append(u, t, 4), v)
}

func (u udata) nest(t byte, in udata) udata { return append(append(u, t, byte(len(in))), in...) }

func udPayload(desc, field uint32) udata {
	return udata{}.u32(0, udExprPayload).nest(1, udata{}.u32(0, desc).u32(1, field))
}

func udNumgen() udata {
	return udata{}.u32(0, udExprNumgen).nest(1, udata{}.u32(0, 1).u32(1, 1).u32(2, 0))
}

func udConcat(items ...udata) udata {
	var in udata
	for i, it := range items {
		in = in.nest(byte(i), it)
	}
	return udata{}.u32(0, udExprConcat).nest(1, in)
}

func udAddr(f servicelb.Family, src bool) udata {
	switch {
	case f == servicelb.IPv6 && src:
		return udPayload(protoDescIP6, fieldIP6Saddr)
	case f == servicelb.IPv6:
		return udPayload(protoDescIP6, fieldIP6Daddr)
	case src:
		return udPayload(protoDescIP, fieldIPSaddr)
	}
	return udPayload(protoDescIP, fieldIPDaddr)
}

func addrType(f servicelb.Family) (uint32, string) {
	if f == servicelb.IPv6 {
		return nfnl.TypeIPv6Addr, "ipv6_addr"
	}
	return nfnl.TypeIPv4Addr, "ipv4_addr"
}

// fixedSets returns the definitions of the table's fixed sets of family f.
func fixedSets(table string, f servicelb.Family, affinitySize uint32) []setDef {
	at, an := addrType(f)
	al := uint32(addrLen(f))
	entry := nfnl.ConcatType(at, nfnl.TypeInetProto, nfnl.TypeInetService)
	entryDecl := fmt.Sprintf("type %s . inet_proto . inet_service", an)
	concatStub := udata{}.u32(udKeyByteOrder, 0).nest(udKeyTypeof, udata{}.u32(0, udExprConcat).nest(1, nil))
	def := func(base string, s nfnl.Set, decl string) setDef {
		s.Family, s.Table, s.Name = nfnl.Inet, table, setName(base, f)
		return setDef{set: s, decl: decl}
	}
	return []setDef{
		def(setServices, nfnl.Set{Flags: nfnl.SetMap, KeyType: entry, KeyLen: al + 8, DataType: nfnl.TypeVerdict,
			UserData: udata{}.u32(udKeyByteOrder, 0).u32(udDataByteOrder, 0).nest(udKeyTypeof, udata{}.u32(0, udExprConcat).nest(1, nil)).u32(udDataInterval, 0)},
			entryDecl+" : verdict"),
		def(setNoEndpoints, nfnl.Set{KeyType: entry, KeyLen: al + 8, UserData: concatStub}, entryDecl),
		def(setFirewall, nfnl.Set{KeyType: entry, KeyLen: al + 8, UserData: concatStub}, entryDecl),
		def(setFirewallPass, nfnl.Set{Flags: nfnl.SetInterval | nfnl.SetConcat, KeyType: nfnl.ConcatType(at, nfnl.TypeInetProto, nfnl.TypeInetService, at),
			KeyLen: 2*al + 8, Fields: []uint32{al, 1, 2, al}, UserData: concatStub},
			fmt.Sprintf("type %s . inet_proto . inet_service . %s\n\t\tflags interval", an, an)),
		def(setHairpin, nfnl.Set{KeyType: nfnl.ConcatType(at, at), KeyLen: 2 * al, UserData: concatStub}, fmt.Sprintf("type %s . %s", an, an)),
		def(setClusterCIDRs, nfnl.Set{Flags: nfnl.SetInterval, KeyType: at, KeyLen: al, UserData: udata{}.u32(udKeyByteOrder, byteOrderBig)},
			fmt.Sprintf("type %s\n\t\tflags interval", an)),
		def(setServiceCIDRs, nfnl.Set{Flags: nfnl.SetInterval, KeyType: at, KeyLen: al, UserData: udata{}.u32(udKeyByteOrder, byteOrderBig)},
			fmt.Sprintf("type %s\n\t\tflags interval", an)),
		def(setAffinity, nfnl.Set{Flags: nfnl.SetTimeout | nfnl.SetEval, KeyType: nfnl.ConcatType(at, nfnl.TypeInteger, nfnl.TypeInteger),
			KeyLen: al + 8, Size: affinitySize,
			UserData: udata{}.u32(udKeyByteOrder, 0).nest(udKeyTypeof, udConcat(udAddr(f, true), udNumgen(), udNumgen()))},
			fmt.Sprintf("typeof %s . numgen random mod 1 . numgen random mod 1\n\t\tsize %d\n\t\tflags dynamic,timeout", addrWord(f, true), affinitySize)),
	}
}

// backendsDef is the definition of one backends map: bucket number to
// endpoint address and port.
func backendsDef(table string, f servicelb.Family, name string) setDef {
	at, _ := addrType(f)
	ud := udata{}.u32(udKeyByteOrder, byteOrderHost).u32(udDataByteOrder, 0).
		nest(udKeyTypeof, udNumgen()).
		nest(udDataTypeof, udConcat(udAddr(f, false), udPayload(protoDescTH, fieldTHDport))).
		u32(udDataInterval, 0)
	return setDef{
		set: nfnl.Set{Family: nfnl.Inet, Table: table, Name: name, Flags: nfnl.SetInterval | nfnl.SetMap,
			KeyType: nfnl.TypeInteger, KeyLen: 4, DataType: nfnl.ConcatType(at, nfnl.TypeInetService),
			DataLen: uint32(addrLen(f)) + 4, UserData: ud},
		decl: fmt.Sprintf("typeof numgen random mod 1 : %s . th dport\n\t\tflags interval", addrWord(f, false)),
	}
}

// sameSet reports whether a dumped set has the definition kproxy writes.
func sameSet(got, want nfnl.Set) bool {
	return got.Name == want.Name && got.Flags == want.Flags && got.KeyType == want.KeyType &&
		got.KeyLen == want.KeyLen && got.DataType == want.DataType && got.DataLen == want.DataLen &&
		got.Size == want.Size && slices.Equal(got.Fields, want.Fields) && bytes.Equal(got.UserData, want.UserData) &&
		got.Timeout == want.Timeout
}

// elem is a set element with its nft text.
type elem struct {
	nfnl.Element
	text string
}

// id identifies the element in its set: the kernel finds elements by key
// (and, in interval sets, by whether they open or close an interval).
func (e *elem) id() string {
	return fmt.Sprintf("%x/%x/%d", e.Key, e.KeyEnd, e.Flags)
}

// same reports whether two elements with the same id hold the same value.
func (e *elem) same(o *elem) bool {
	if (e.Verdict == nil) != (o.Verdict == nil) {
		return false
	}
	if e.Verdict != nil && *e.Verdict != *o.Verdict {
		return false
	}
	return bytes.Equal(e.Data, o.Data)
}

func sortElems(es []elem) {
	slices.SortFunc(es, func(a, b elem) int {
		return cmp.Or(bytes.Compare(a.Key, b.Key), cmp.Compare(a.Flags, b.Flags), bytes.Compare(a.KeyEnd, b.KeyEnd))
	})
}

// entryBytes is the key of "ip daddr . meta l4proto . th dport": the
// address, then the protocol and the port each padded to four bytes.
func entryBytes(a netip.Addr, p servicelb.Protocol, port uint16) []byte {
	b := a.AsSlice()
	b = append(b, p.Number(), 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(b, port), 0, 0)
}

func entryText(a netip.Addr, p servicelb.Protocol, port uint16) string {
	return fmt.Sprintf("%s . %s . %d", a, p.Lower(), port)
}

func entryElem(a netip.Addr, p servicelb.Protocol, port uint16) elem {
	return elem{Element: nfnl.Element{Key: entryBytes(a, p, port)}, text: entryText(a, p, port)}
}

func vmapElem(a netip.Addr, p servicelb.Protocol, port uint16, chain string) elem {
	e := entryElem(a, p, port)
	e.Verdict = &nfnl.Verdict{Code: nfnl.VerdictGoto, Chain: chain}
	e.text += " : goto " + chain
	return e
}

// lastAddr returns the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// prefixElems returns the elements of an interval set holding p: the
// interval's start, and its end (the first address after it) unless the
// interval runs to the end of the address space.
func prefixElems(p netip.Prefix) []elem {
	p = p.Masked()
	out := []elem{{Element: nfnl.Element{Key: p.Addr().AsSlice()}, text: prefixText(p)}}
	if next := lastAddr(p).Next(); next.IsValid() {
		out = append(out, elem{Element: nfnl.Element{Key: next.AsSlice(), Flags: nfnl.ElemIntervalEnd}})
	}
	return out
}

// firewallElem allows source range src for an entry.
func firewallElem(a netip.Addr, p servicelb.Protocol, port uint16, src netip.Prefix) elem {
	key := append(entryBytes(a, p, port), src.Masked().Addr().AsSlice()...)
	end := append(entryBytes(a, p, port), lastAddr(src).AsSlice()...)
	return elem{Element: nfnl.Element{Key: key, KeyEnd: end}, text: entryText(a, p, port) + " . " + prefixText(src)}
}

func hairpinElem(a netip.Addr) elem {
	return elem{Element: nfnl.Element{Key: append(a.AsSlice(), a.AsSlice()...)}, text: fmt.Sprintf("%s . %s", a, a)}
}

// backendElems returns the intervals of one slot: bucket ranges sized by
// weight, each mapped to its endpoint. Each interval is a start element
// with the endpoint and an end element at the first bucket after it (which
// the kernel keeps apart from the next interval's start at the same key).
func backendElems(slot uint32, bs []servicelb.Backend, counts []uint32) []elem {
	base := slot * bucketStride
	out := make([]elem, 0, 2*len(bs))
	lo := uint32(0)
	for i, b := range bs {
		hi := lo + counts[i] - 1
		data := append(b.Addr.AsSlice(), 0, 0, 0, 0)
		binary.BigEndian.PutUint16(data[len(data)-4:], b.Port)
		out = append(out,
			elem{
				Element: nfnl.Element{Key: bigU32(base + lo), Data: data},
				text:    fmt.Sprintf("%d-%d : %s . %d", base+lo, base+hi, b.Addr, b.Port),
			},
			elem{Element: nfnl.Element{Key: bigU32(base + hi + 1), Flags: nfnl.ElemIntervalEnd}})
		lo = hi + 1
	}
	return out
}

// setText renders a set declaration with its elements.
func setText(d setDef, es []elem, b *strings.Builder) {
	kind := "set"
	if d.set.Flags&nfnl.SetMap != 0 {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s\n", kind, d.set.Name, d.decl)
	var texts []string
	for i := range es {
		if es[i].text != "" {
			texts = append(texts, es[i].text)
		}
	}
	if len(texts) > 0 {
		fmt.Fprintf(b, "\t\telements = { %s }\n", strings.Join(texts, ",\n\t\t\t     "))
	}
	b.WriteString("\t}\n")
}
