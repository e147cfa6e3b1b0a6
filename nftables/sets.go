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

// The table's named sets and maps: a fixed list per family, plus one set
// of frontends for each verdict shape in use and for each number of
// buckets in use. Their number does not grow with the number of services.
// A setID numbers them.
type setID uint16

// The kinds of fixed sets.
const (
	kindServices     = iota // entry -> goto the entry chain of a port with affinity
	kindClusterIPs          // every cluster IP of the state
	kindFirewall            // load-balancer entries with source ranges
	kindFirewallPass        // entry . allowed source range
	kindHairpin             // endpoint . endpoint
	kindPodCIDRs            // the sources of the node's pods (NodeConfig.LocalMatch)
	kindServiceCIDRs        // NodeConfig.ServiceCIDRs
	kindAffinity            // client . slot . endpoint, dynamic
	kindEndpoints           // entry . bucket -> endpoint
	kindProtocols           // the protocols a service port may have
	numKinds
	// The kinds of the sets that exist while some port needs them.
	kindShape   = numKinds     // the entries whose verdicts make one shape
	kindBuckets = numKinds + 1 // the entries that spread over B buckets
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
	case kindEndpoints:
		return "endpoints"
	case kindProtocols:
		return "protocols"
	case kindShape:
		return "verdicts"
	}
	return "buckets"
}

// The numbering of setIDs: the fixed sets (kind*2 + family), then the
// shape sets (a shape's code per family), then the bucket sets (the
// number of buckets, per family and per set of endpoints).
const (
	firstShape   = numKinds * 2
	firstBuckets = firstShape + 2*shapeCodes
	bucketIDs    = 2 * bucketStride // per family: cluster's, then local's
)

func fixedSet(kind int, f servicelb.Family) setID { return setID(kind*2 + famIndex(f)) }

// shapeSet is the set of the entries whose verdicts are vs: the entries
// the services chain sends to vs's chain.
func shapeSet(f servicelb.Family, vs servicelb.Verdicts) setID {
	return setID(firstShape + famIndex(f)*shapeCodes + int(shapeCode(vs)))
}

// bucketSet is the set of the entries whose cluster or local endpoints
// spread over n buckets.
func bucketSet(f servicelb.Family, local bool, n uint32) setID {
	return setID(firstBuckets + famIndex(f)*bucketIDs + int(boolByte(local))*bucketStride + int(n))
}

func (s setID) family() servicelb.Family {
	var i int
	switch {
	case s >= firstBuckets:
		i = (int(s) - firstBuckets) / bucketIDs
	case s >= firstShape:
		i = (int(s) - firstShape) / shapeCodes
	default:
		i = int(s) % 2
	}
	if i == 1 {
		return servicelb.IPv6
	}
	return servicelb.IPv4
}

func (s setID) kind() int {
	switch {
	case s >= firstBuckets:
		return kindBuckets
	case s >= firstShape:
		return kindShape
	}
	return int(s) / 2
}

// verdicts returns the verdicts of a shape set.
func (s setID) verdicts() servicelb.Verdicts {
	return shapeVerdicts(uint16((int(s) - firstShape) % shapeCodes))
}

// buckets returns the number of buckets of a bucket set, and whether it
// spreads local endpoints.
func (s setID) buckets() (n uint32, local bool) {
	i := (int(s) - firstBuckets) % bucketIDs
	return uint32(i % bucketStride), i >= bucketStride
}

func (s setID) name() string {
	f := fam(s.family())
	switch s.kind() {
	case kindShape:
		return shapeName(f, s.verdicts())
	case kindBuckets:
		n, local := s.buckets()
		of := "cluster"
		if local {
			of = "local"
		}
		return "buckets" + f + "/" + of + "-" + strconv.Itoa(int(n))
	}
	return kindName(s.kind()) + f
}

// interval reports whether the set holds intervals as separate start and
// end elements (the kernel's rbtree sets).
func (s setID) interval() bool {
	k := s.kind()
	return k == kindPodCIDRs || k == kindServiceCIDRs
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
	udExprMeta      = 9
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
	metaL4proto     = 16
)

func (u udata) u32(t byte, v uint32) udata {
	return binary.NativeEndian.AppendUint32(append(u, t, 4), v)
}

func (u udata) nest(t byte, in udata) udata { return append(append(u, t, byte(len(in))), in...) }

func udPayload(desc, field uint32) udata {
	return udata{}.u32(0, udExprPayload).nest(1, udata{}.u32(0, desc).u32(1, field))
}

func udMeta(key uint32) udata {
	return udata{}.u32(0, udExprMeta).nest(1, udata{}.u32(0, key))
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
		{kindEndpoints, nfnl.Set{Flags: nfnl.SetMap, KeyType: nfnl.ConcatType(at, nfnl.TypeInetProto, nfnl.TypeInetService, nfnl.TypeInteger),
			KeyLen: al + 12, DataType: nfnl.ConcatType(at, nfnl.TypeInetService), DataLen: al + 4,
			UserData: udata{}.u32(udKeyByteOrder, 0).u32(udDataByteOrder, 0).
				nest(udKeyTypeof, udConcat(udAddr(f, false), udMeta(metaL4proto), udPayload(protoDescTH, fieldTHDport), udNumgen())).
				nest(udDataTypeof, udConcat(udAddr(f, false), udPayload(protoDescTH, fieldTHDport))).
				u32(udDataInterval, 0)},
			fmt.Sprintf("typeof %s . meta l4proto . th dport . numgen random mod 1 : %s . th dport", addrWord(f, false), addrWord(f, false))},
		{kindProtocols, nfnl.Set{KeyType: nfnl.TypeInetProto, KeyLen: 1, UserData: udata{}.u32(udKeyByteOrder, 0)}, "type inet_proto"},
	}
	out := make([]setDef, len(defs))
	for i, d := range defs {
		id := fixedSet(d.kind, f)
		d.set.Family, d.set.Table, d.set.Name = nfnl.Inet, table, id.name()
		out[i] = setDef{id: id, set: d.set, decl: d.decl}
	}
	return out
}

// dynamicDef is the definition of a set that exists while some port
// needs it: a shape's or a bucket count's set of frontends.
func dynamicDef(table string, id setID) setDef {
	at, an := addrType(id.family())
	al := uint32(addrLen(id.family()))
	return setDef{
		id: id,
		set: nfnl.Set{Family: nfnl.Inet, Table: table, Name: id.name(), KeyType: nfnl.ConcatType(at, nfnl.TypeInetProto, nfnl.TypeInetService),
			KeyLen: al + 8, UserData: udata{}.u32(udKeyByteOrder, 0).nest(udKeyTypeof, udata{}.u32(0, udExprConcat).nest(1, nil))},
		decl: "type " + an + " . inet_proto . inet_service",
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
	return appendEntry(make([]byte, 0, a.BitLen()/8+8), a, p, port)
}

// appendEntry appends an entry key (entryBytes) to b.
func appendEntry(b []byte, a netip.Addr, p servicelb.Protocol, port uint16) []byte {
	b = appendAddr(b, a)
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

// endpointElems appends the elements of the endpoints map that spread
// one frontend's flows (its entry key) over bs: bucket from+j to
// bs[owners[j]] (bucketOwners). Their bytes are appended to buf and stay
// referred to: buf may be appended to again, not overwritten, while they
// are in use.
func endpointElems(out []elem, buf []byte, entry []byte, from uint32, bs []servicelb.Backend, owners []int32) ([]elem, []byte) {
	for j, o := range owners {
		b := &bs[o]
		at := len(buf)
		buf = append(buf, entry...)
		buf = binary.NativeEndian.AppendUint32(buf, from+uint32(j))
		k := len(buf)
		buf = appendAddr(buf, b.Addr)
		buf = append(binary.BigEndian.AppendUint16(buf, b.Port), 0, 0)
		out = append(out, elem{key: buf[at:k:k], data: buf[k:len(buf):len(buf)]})
	}
	return out, buf
}
