//go:build linux

package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"net/netip"
	"slices"
	"strconv"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The table's named sets and maps: a fixed list per family, plus the
// backends maps (shards of them per family). Their number does not grow
// with the number of services. A setID numbers them.
type setID uint16

// The kinds of fixed sets.
const (
	kindServices     = iota // entry -> goto svc/ext chain
	kindClusterIPs          // every cluster IP of the state
	kindFirewall            // load-balancer entries with source ranges
	kindFirewallPass        // entry . allowed source range
	kindHairpin             // endpoint . endpoint
	kindPodCIDRs            // the sources of the node's pods (NodeConfig.LocalMatch)
	kindServiceCIDRs        // NodeConfig.ServiceCIDRs
	kindAffinity            // client . slot . endpoint, dynamic
	numKinds
	kindBackends = numKinds // bucket -> endpoint, one map per shard
)

func kindName(k int) string {
	switch k {
	case kindServices:
		return "services"
	case kindClusterIPs:
		return "cluster-ips"
	case kindFirewall:
		return "firewall"
	case kindFirewallPass:
		return "firewall-allow"
	case kindHairpin:
		return "hairpin"
	case kindPodCIDRs:
		return "pod-cidrs"
	case kindServiceCIDRs:
		return "service-cidrs"
	case kindAffinity:
		return "affinity"
	}
	return "backends"
}

const firstShard = numKinds * 2

func fixedSet(kind int, f servicelb.Family) setID { return setID(kind*2 + famIndex(f)) }

func shardSet(f servicelb.Family, slot uint32) setID {
	return setID(firstShard + famIndex(f)*shards + int(slot%shards))
}

func (s setID) family() servicelb.Family {
	i := int(s) % 2
	if s >= firstShard {
		i = (int(s) - firstShard) / shards
	}
	if i == 1 {
		return servicelb.IPv6
	}
	return servicelb.IPv4
}

func (s setID) kind() int {
	if s >= firstShard {
		return kindBackends
	}
	return int(s) / 2
}

func (s setID) name() string {
	n := kindName(s.kind()) + fam(s.family())
	if s >= firstShard {
		i := (int(s) - firstShard) % shards
		if i < 10 {
			n += "-0"
		} else {
			n += "-"
		}
		n += strconv.Itoa(i)
	}
	return n
}

// interval reports whether the set holds intervals as separate start and
// end elements (the kernel's rbtree sets).
func (s setID) interval() bool {
	k := s.kind()
	return k == kindBackends || k == kindPodCIDRs || k == kindServiceCIDRs
}

// setDef is a set's definition, for the kernel and for nft text.
type setDef struct {
	id   setID
	set  nfnl.Set
	decl string // the "type ...; flags ..." lines of its nft declaration
}

// udata builds nft's set user data: type-length-value records (one byte
// each for type and length, values in host byte order) through which nft
// learns a key's byte order and "typeof" expressions. kproxy writes what
// nft itself writes for the same declaration, so that nft lists the sets
// exactly as it would list its own.
type udata []byte

// Record types (libnftnl's NFTNL_UDATA_SET_*) and nft's numbers for
// expression types, protocol descriptions and header fields, as nft writes
// them in "typeof" records.
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
	return binary.NativeEndian.AppendUint32(append(u, t, 4), v)
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
	entryDecl := "type " + an + " . inet_proto . inet_service"
	concatStub := udata{}.u32(udKeyByteOrder, 0).nest(udKeyTypeof, udata{}.u32(0, udExprConcat).nest(1, nil))
	cidr := nfnl.Set{Flags: nfnl.SetInterval, KeyType: at, KeyLen: al, UserData: udata{}.u32(udKeyByteOrder, byteOrderBig)}
	defs := []struct {
		kind int
		set  nfnl.Set
		decl string
	}{
		{kindServices, nfnl.Set{Flags: nfnl.SetMap, KeyType: entry, KeyLen: al + 8, DataType: nfnl.TypeVerdict,
			UserData: udata{}.u32(udKeyByteOrder, 0).u32(udDataByteOrder, 0).nest(udKeyTypeof, udata{}.u32(0, udExprConcat).nest(1, nil)).u32(udDataInterval, 0)},
			entryDecl + " : verdict"},
		{kindClusterIPs, nfnl.Set{KeyType: at, KeyLen: al, UserData: udata{}.u32(udKeyByteOrder, byteOrderBig)}, "type " + an},
		{kindFirewall, nfnl.Set{KeyType: entry, KeyLen: al + 8, UserData: concatStub}, entryDecl},
		{kindFirewallPass, nfnl.Set{Flags: nfnl.SetInterval | nfnl.SetConcat, KeyType: nfnl.ConcatType(at, nfnl.TypeInetProto, nfnl.TypeInetService, at),
			KeyLen: 2*al + 8, Fields: []uint32{al, 1, 2, al}, UserData: concatStub},
			entryDecl + " . " + an + "\n\t\tflags interval"},
		{kindHairpin, nfnl.Set{KeyType: nfnl.ConcatType(at, at), KeyLen: 2 * al, UserData: concatStub}, "type " + an + " . " + an},
		{kindPodCIDRs, cidr, "type " + an + "\n\t\tflags interval"},
		{kindServiceCIDRs, cidr, "type " + an + "\n\t\tflags interval"},
		{kindAffinity, nfnl.Set{Flags: nfnl.SetTimeout | nfnl.SetEval, KeyType: nfnl.ConcatType(at, nfnl.TypeInteger, nfnl.TypeInteger),
			KeyLen: al + 8, Size: affinitySize,
			UserData: udata{}.u32(udKeyByteOrder, 0).nest(udKeyTypeof, udConcat(udAddr(f, true), udNumgen(), udNumgen()))},
			fmt.Sprintf("typeof %s . numgen random mod 1 . numgen random mod 1\n\t\tsize %d\n\t\tflags dynamic,timeout", addrWord(f, true), affinitySize)},
	}
	out := make([]setDef, len(defs))
	for i, d := range defs {
		id := fixedSet(d.kind, f)
		d.set.Family, d.set.Table, d.set.Name = nfnl.Inet, table, id.name()
		out[i] = setDef{id: id, set: d.set, decl: d.decl}
	}
	return out
}

// backendsDef is the definition of one backends map: bucket number to
// endpoint address and port.
func backendsDef(table string, id setID) setDef {
	f := id.family()
	at, _ := addrType(f)
	ud := udata{}.u32(udKeyByteOrder, byteOrderHost).u32(udDataByteOrder, 0).
		nest(udKeyTypeof, udNumgen()).
		nest(udDataTypeof, udConcat(udAddr(f, false), udPayload(protoDescTH, fieldTHDport))).
		u32(udDataInterval, 0)
	return setDef{
		id: id,
		set: nfnl.Set{Family: nfnl.Inet, Table: table, Name: id.name(), Flags: nfnl.SetInterval | nfnl.SetMap,
			KeyType: nfnl.TypeInteger, KeyLen: 4, DataType: nfnl.ConcatType(at, nfnl.TypeInetService),
			DataLen: uint32(addrLen(f)) + 4, UserData: ud},
		decl: "typeof numgen random mod 1 : " + addrWord(f, false) + " . th dport\n\t\tflags interval",
	}
}

// sameSet reports whether a dumped set has the definition kproxy writes.
func sameSet(got, want nfnl.Set) bool {
	if want.DataType == nfnl.TypeVerdict {
		want.DataLen = got.DataLen // the kernel's size of a verdict
	}
	return got.Name == want.Name && got.Flags == want.Flags && got.KeyType == want.KeyType &&
		got.KeyLen == want.KeyLen && got.DataType == want.DataType && got.DataLen == want.DataLen &&
		got.Size == want.Size && slices.Equal(got.Fields, want.Fields) && bytes.Equal(got.UserData, want.UserData) &&
		got.Timeout == want.Timeout
}

// elem is a set element. Its nft text is derived from its bytes when the
// table is rendered.
type elem struct {
	key, keyEnd, data []byte
	chain             string // the goto target of a verdict map element
	flags             uint32
}

// id identifies the element in its set: the kernel finds elements by key
// (and, in interval sets, by whether they open or close an interval).
func (e *elem) id() string {
	return string(e.key) + "\x00" + string(e.keyEnd) + string(rune('0'+e.flags))
}

// same reports whether two elements with the same id hold the same value.
func (e *elem) same(o *elem) bool { return e.chain == o.chain && bytes.Equal(e.data, o.data) }

// equal reports whether two elements have the same id and value, without
// building their ids.
func (e *elem) equal(o *elem) bool {
	return e.flags == o.flags && bytes.Equal(e.key, o.key) && bytes.Equal(e.keyEnd, o.keyEnd) && e.same(o)
}

// hash hashes everything that identifies the element and its value.
func (e *elem) hash(seed maphash.Seed) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	h.Write(e.key)
	h.WriteByte(0)
	h.Write(e.keyEnd)
	h.WriteByte(byte(e.flags))
	h.Write(e.data)
	h.WriteString(e.chain)
	return h.Sum64()
}

func (e *elem) element() nfnl.Element {
	el := nfnl.Element{Key: e.key, KeyEnd: e.keyEnd, Data: e.data, Flags: e.flags}
	if e.chain != "" {
		el.Verdict = &nfnl.Verdict{Code: nfnl.VerdictGoto, Chain: e.chain}
	}
	return el
}

func elemOf(el nfnl.Element) elem {
	e := elem{key: el.Key, keyEnd: el.KeyEnd, data: el.Data, flags: el.Flags}
	if el.Verdict != nil {
		e.chain = el.Verdict.Chain
		if el.Verdict.Code != nfnl.VerdictGoto {
			e.chain = "!" + el.Verdict.String()
		}
	}
	return e
}

// entryBytes is the key of "ip daddr . meta l4proto . th dport": the
// address, then the protocol and the port each padded to four bytes.
func entryBytes(a netip.Addr, p servicelb.Protocol, port uint16) []byte {
	b := appendAddr(make([]byte, 0, a.BitLen()/8+8), a)
	b = append(b, p.Number(), 0, 0, 0)
	return append(binary.BigEndian.AppendUint16(b, port), 0, 0)
}

// appendAddr appends an address's bytes.
func appendAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		a4 := a.As4()
		return append(b, a4[:]...)
	}
	a16 := a.As16()
	return append(b, a16[:]...)
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

// prefixElems returns the elements of an interval set holding p: the
// interval's start, and its end (the first address after it) unless the
// interval runs to the end of the address space.
func prefixElems(p netip.Prefix) []elem {
	p = p.Masked()
	out := []elem{{key: p.Addr().AsSlice()}}
	if next := lastAddr(p).Next(); next.IsValid() {
		out = append(out, elem{key: next.AsSlice(), flags: nfnl.ElemIntervalEnd})
	}
	return out
}

// firewallElem allows source range src for an entry.
func firewallElem(a netip.Addr, p servicelb.Protocol, port uint16, src netip.Prefix) elem {
	key := append(entryBytes(a, p, port), src.Masked().Addr().AsSlice()...)
	end := append(entryBytes(a, p, port), lastAddr(src).AsSlice()...)
	return elem{key: key, keyEnd: end}
}

func hairpinElem(a netip.Addr) elem {
	return elem{key: appendAddr(appendAddr(make([]byte, 0, a.BitLen()/4), a), a)}
}

// backendElems returns the intervals of one slot: bucket ranges sized by
// weight, each mapped to its endpoint. Each interval is a start element
// with the endpoint and an end element at the first bucket after it (which
// the kernel keeps apart from the next interval's start at the same key).
// They come in ascending order, as the kernel accepts them.
func backendElems(slot uint32, bs []servicelb.Backend, counts []uint32) []elem {
	out, _ := appendBackendElems(make([]elem, 0, 2*len(bs)), make([]byte, 0, len(bs)*backendElemBytes), slot, bs, counts)
	return out
}

// backendElemBytes bounds the bytes of one endpoint's two elements: two
// keys, an address and a port.
const backendElemBytes = 8 + 16 + 4

// appendBackendElems appends backendElems' elements to out, their bytes
// to buf (each range's start key, end key and data), and returns both.
// The elements keep referring to buf's bytes: buf may be appended to
// again, not overwritten, while they are in use.
func appendBackendElems(out []elem, buf []byte, slot uint32, bs []servicelb.Backend, counts []uint32) ([]elem, []byte) {
	base := slot * bucketStride
	lo := uint32(0)
	for i, b := range bs {
		end := lo + counts[i]
		at := len(buf)
		buf = binary.BigEndian.AppendUint32(buf, base+lo)
		buf = binary.BigEndian.AppendUint32(buf, base+end)
		buf = appendAddr(buf, b.Addr)
		buf = append(binary.BigEndian.AppendUint16(buf, b.Port), 0, 0)
		out = append(out,
			elem{key: buf[at : at+4 : at+4], data: buf[at+8 : len(buf) : len(buf)]},
			elem{key: buf[at+4 : at+8 : at+8], flags: nfnl.ElemIntervalEnd})
		lo = end
	}
	return out, buf
}

// rangeStart is the element that begins a range, holding its endpoint.
func rangeStart(base, lo uint32, b servicelb.Backend) elem {
	data := appendAddr(make([]byte, 0, b.Addr.BitLen()/8+4), b.Addr)
	data = append(binary.BigEndian.AppendUint16(data, b.Port), 0, 0)
	return elem{key: bigU32(base + lo), data: data}
}

// rangeEnd is the element that ends a range.
func rangeEnd(base, end uint32) elem {
	return elem{key: bigU32(base + end), flags: nfnl.ElemIntervalEnd}
}

// ranges are the buckets of one slot shared among its endpoints, in
// ascending order: endpoint i takes buckets lo[i] to lo[i+1]-1.
type ranges struct {
	bs []servicelb.Backend
	lo []uint32
}

// rangesOf shares a slot among bs as backendElems does; none when bs is
// empty or has more endpoints than buckets.
func rangesOf(bs []servicelb.Backend) ranges {
	counts := bucketCounts(bs)
	if counts == nil {
		return ranges{}
	}
	lo := make([]uint32, len(bs)+1)
	for i, c := range counts {
		lo[i+1] = lo[i] + c
	}
	return ranges{bs: bs, lo: lo}
}

func (r *ranges) len() int { return len(r.bs) }

// appendElems appends the elements of range i in a slot from base.
func (r *ranges) appendElems(es []elem, base uint32, i int) []elem {
	return append(es, r.start(base, i), rangeEnd(base, r.lo[i+1]))
}

// start returns the element that begins range i in a slot from base.
func (r *ranges) start(base uint32, i int) elem {
	return rangeStart(base, r.lo[i], r.bs[i])
}
