//go:build linux

package xtables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
)

// ErrInvalidRule reports a rule that cannot be encoded, such as a name
// that is too long or an address of the wrong family.
var ErrInvalidRule = errors.New("invalid rule")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRule, fmt.Sprintf(format, args...))
}

// Netlink attribute flags and nf_tables attribute numbers used by the
// encoder (linux/netfilter/nf_tables.h).
const (
	nlaNested = 0x8000

	attrListElem = 1
	attrExprName = 1
	attrExprData = 2

	attrMetaDreg = 1
	attrMetaKey  = 2

	attrCmpSreg = 1
	attrCmpOp   = 2
	attrCmpData = 3

	attrPayloadDreg   = 1
	attrPayloadBase   = 2
	attrPayloadOffset = 3
	attrPayloadLen    = 4

	attrBitwiseSreg = 1
	attrBitwiseDreg = 2
	attrBitwiseLen  = 3
	attrBitwiseMask = 4
	attrBitwiseXor  = 5

	attrImmDreg = 1
	attrImmData = 2

	attrDataValue   = 1
	attrDataVerdict = 2
	attrVerdictCode = 1
	attrVerdictChan = 2

	attrCounterBytes   = 1
	attrCounterPackets = 2

	attrXtName = 1
	attrXtRev  = 2
	attrXtInfo = 3

	metaIifname = 6
	metaOifname = 7
	metaMark    = 3
	metaL4proto = 16

	payloadNetwork   = 1
	payloadTransport = 2

	cmpEq  = 0
	cmpNeq = 1

	regVerdict = 0
	reg1       = 1

	verdictDrop   = 0
	verdictAccept = 1
	verdictJump   = -3
	verdictGoto   = -4
	verdictReturn = -5
)

// exprWriter appends netlink attributes to a buffer. Attribute headers are
// in host byte order, values in network byte order unless noted.
type exprWriter struct {
	b   []byte
	tmp []byte // scratch for xt info blobs
}

// blob returns n zeroed bytes of scratch space, valid until the next call.
func (w *exprWriter) blob(n int) []byte {
	if cap(w.tmp) < n {
		w.tmp = make([]byte, n)
	}
	w.tmp = w.tmp[:n]
	clear(w.tmp)
	return w.tmp
}

// begin opens a nested attribute and returns its offset for end.
func (w *exprWriter) begin(typ uint16) int {
	off := len(w.b)
	w.header(0, typ|nlaNested)
	return off
}

// header appends an attribute header, in host byte order.
func (w *exprWriter) header(n int, typ uint16) {
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(n))
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
}

// end closes the nested attribute opened at off.
func (w *exprWriter) end(off int) {
	binary.NativeEndian.PutUint16(w.b[off:], uint16(len(w.b)-off))
}

func (w *exprWriter) attr(typ uint16, data []byte) {
	w.header(4+len(data), typ)
	w.b = append(w.b, data...)
	w.pad()
}

func (w *exprWriter) pad() {
	for len(w.b)%4 != 0 {
		w.b = append(w.b, 0)
	}
}

func (w *exprWriter) u32(typ uint16, v uint32) {
	w.header(8, typ)
	w.b = binary.BigEndian.AppendUint32(w.b, v)
}

func (w *exprWriter) u64(typ uint16, v uint64) {
	w.header(12, typ)
	w.b = binary.BigEndian.AppendUint64(w.b, v)
}

// str appends a NUL-terminated string attribute.
func (w *exprWriter) str(typ uint16, s string) {
	w.header(4+len(s)+1, typ)
	w.b = append(w.b, s...)
	w.b = append(w.b, 0)
	w.pad()
}

// expr opens one expression of the rule's list and returns the offsets to
// close with endExpr.
func (w *exprWriter) expr(name string) (int, int) {
	elem := w.begin(attrListElem)
	w.str(attrExprName, name)
	return elem, w.begin(attrExprData)
}

func (w *exprWriter) endExpr(elem, data int) {
	w.end(data)
	w.end(elem)
}

func (w *exprWriter) meta(key uint32) {
	e, d := w.expr("meta")
	w.u32(attrMetaKey, key)
	w.u32(attrMetaDreg, reg1)
	w.endExpr(e, d)
}

func (w *exprWriter) cmp(op uint32, data []byte) {
	e, d := w.expr("cmp")
	w.u32(attrCmpSreg, reg1)
	w.u32(attrCmpOp, op)
	v := w.begin(attrCmpData)
	w.attr(attrDataValue, data)
	w.end(v)
	w.endExpr(e, d)
}

func (w *exprWriter) payload(base, offset, n uint32) {
	e, d := w.expr("payload")
	w.u32(attrPayloadDreg, reg1)
	w.u32(attrPayloadBase, base)
	w.u32(attrPayloadOffset, offset)
	w.u32(attrPayloadLen, n)
	w.endExpr(e, d)
}

func (w *exprWriter) bitwise(mask, xor []byte) {
	e, d := w.expr("bitwise")
	w.u32(attrBitwiseSreg, reg1)
	w.u32(attrBitwiseDreg, reg1)
	w.u32(attrBitwiseLen, uint32(len(mask)))
	m := w.begin(attrBitwiseMask)
	w.attr(attrDataValue, mask)
	w.end(m)
	x := w.begin(attrBitwiseXor)
	w.attr(attrDataValue, xor)
	w.end(x)
	w.endExpr(e, d)
}

func (w *exprWriter) counter() {
	e, d := w.expr("counter")
	w.u64(attrCounterBytes, 0)
	w.u64(attrCounterPackets, 0)
	w.endExpr(e, d)
}

func (w *exprWriter) verdict(code int32, chain string) {
	e, d := w.expr("immediate")
	w.u32(attrImmDreg, regVerdict)
	data := w.begin(attrImmData)
	v := w.begin(attrDataVerdict)
	w.u32(attrVerdictCode, uint32(code))
	if chain != "" {
		w.str(attrVerdictChan, chain)
	}
	w.end(v)
	w.end(data)
	w.endExpr(e, d)
}

// Extension is an xtables match or target at one revision.
type Extension struct {
	Name   string
	Rev    uint32
	Target bool
}

// The extensions the encoder writes, each at the revision it writes.
var (
	xtComment    = Extension{Name: "comment"}
	xtTCP        = Extension{Name: "tcp"}
	xtUDP        = Extension{Name: "udp"}
	xtSCTP       = Extension{Name: "sctp"}
	xtStatistic  = Extension{Name: "statistic"}
	xtRecent     = Extension{Name: "recent", Rev: 1}
	xtAddrType   = Extension{Name: "addrtype", Rev: 1}
	xtConntrack  = Extension{Name: "conntrack", Rev: 3}
	xtSet        = Extension{Name: "set", Rev: 4}
	xtDNAT       = Extension{Name: "DNAT", Rev: 2, Target: true}
	xtMasquerade = Extension{Name: "MASQUERADE", Target: true}
	xtMark       = Extension{Name: "MARK", Rev: 2, Target: true}
	xtReject     = Extension{Name: "REJECT", Target: true}
)

// Extensions returns every extension the encoder may write, for a probe
// of the kernel's support before the first rule: iptables asks the
// kernel the same before it writes a rule calling one. The set match
// only with sets (the ipvs backend's rules match ipsets). The sctp match
// is left out, as a kernel without SCTP refuses only the SCTP services'
// rules.
func Extensions(sets bool) []Extension {
	out := []Extension{xtComment, xtTCP, xtUDP, xtStatistic, xtRecent, xtAddrType, xtConntrack,
		xtDNAT, xtMasquerade, xtMark, xtReject}
	if sets {
		out = append(out, xtSet)
	}
	return out
}

// xt appends an xt match or target expression whose info blob is the
// kernel structure in native byte order, padded to 8.
func (w *exprWriter) xt(x Extension, info []byte) {
	kind := "match"
	if x.Target {
		kind = "target"
	}
	e, d := w.expr(kind)
	w.str(attrXtName, x.Name)
	w.u32(attrXtRev, x.Rev)
	n := (len(info) + 7) &^ 7
	w.header(4+n, attrXtInfo)
	w.b = append(w.b, info...)
	for i := len(info); i < n; i++ {
		w.b = append(w.b, 0)
	}
	w.endExpr(e, d)
}

// encodeRule appends the expressions of r (the contents of
// NFTA_RULE_EXPRESSIONS) in the order iptables-nft writes them:
// interfaces, protocol, addresses, extension matches, counter, target.
func encodeRule(w *exprWriter, f Family, r *Rule) error {
	if err := r.check(f); err != nil {
		return err
	}
	if r.In != "" {
		w.meta(metaIifname)
		w.cmp(cmpOp(r.NotIn), ifaceBytes(r.In))
	}
	if r.Out != "" {
		w.meta(metaOifname)
		w.cmp(cmpOp(r.NotOut), ifaceBytes(r.Out))
	}
	if r.Proto != 0 {
		w.meta(metaL4proto)
		w.cmp(cmpOp(r.NotProto), []byte{r.Proto})
	}
	srcOff, dstOff := uint32(12), uint32(16)
	if f == IPv6 {
		srcOff, dstOff = 8, 24
	}
	encodeAddr(w, r.Src, r.NotSrc, srcOff)
	encodeAddr(w, r.Dst, r.NotDst, dstOff)
	for _, m := range r.Matches {
		if err := m.encode(w, f); err != nil {
			return err
		}
	}
	w.counter()
	if r.Target != nil {
		return r.Target.encode(w, f)
	}
	return nil
}

func cmpOp(invert bool) uint32 {
	if invert {
		return cmpNeq
	}
	return cmpEq
}

// ifaceBytes returns the bytes iptables compares an interface name with:
// the name and its NUL, or only the prefix for a name ending in '+'.
func ifaceBytes(name string) []byte {
	if strings.HasSuffix(name, "+") {
		return []byte(name[:len(name)-1])
	}
	return append([]byte(name), 0)
}

// encodeAddr matches a prefix as iptables-nft does: only the significant
// bytes of a byte-aligned prefix, else the whole address under a mask.
func encodeAddr(w *exprWriter, p netip.Prefix, invert bool, off uint32) {
	if !p.IsValid() || p.Bits() == 0 {
		return
	}
	addr := p.Addr().AsSlice()
	bits := p.Bits()
	if bits%8 == 0 {
		w.payload(payloadNetwork, off, uint32(bits/8))
		w.cmp(cmpOp(invert), addr[:bits/8])
		return
	}
	mask := make([]byte, len(addr))
	for i := range mask {
		switch {
		case bits >= 8*(i+1):
			mask[i] = 0xff
		case bits > 8*i:
			mask[i] = byte(0xff << (8 - (bits - 8*i)))
		}
	}
	w.payload(payloadNetwork, off, uint32(len(addr)))
	w.bitwise(mask, make([]byte, len(addr)))
	w.cmp(cmpOp(invert), addr)
}

// check validates the parts of a rule the kernel or iptables would refuse.
func (r *Rule) check(f Family) error {
	for _, p := range []netip.Prefix{r.Src, r.Dst} {
		if !p.IsValid() {
			continue
		}
		if FamilyOf(p.Addr()) != f || p.Addr().Is4In6() {
			return invalidf("address %s in an %s table", p, f)
		}
		if p.Masked() != p {
			return invalidf("prefix %s has host bits set", p)
		}
	}
	for _, i := range []string{r.In, r.Out} {
		if len(i) >= 16 || i == "+" {
			return invalidf("interface name %q", i)
		}
	}
	if (r.NotSrc && !r.Src.IsValid()) || (r.NotDst && !r.Dst.IsValid()) ||
		(r.NotIn && r.In == "") || (r.NotOut && r.Out == "") || (r.NotProto && r.Proto == 0) {
		return invalidf("negation of an empty match")
	}
	if r.Target != nil {
		if c := r.Target.jumpsTo(); c != "" {
			if err := checkChainName(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkChainName validates a user chain name as iptables does.
func checkChainName(name string) error {
	switch {
	case name == "":
		return invalidf("empty chain name")
	case len(name) > MaxChainNameLen:
		return invalidf("chain name %q longer than %d", name, MaxChainNameLen)
	case name[0] == '-' || name[0] == '!':
		return invalidf("chain name %q", name)
	case strings.ContainsAny(name, " \t\n\""):
		return invalidf("chain name %q has blanks or quotes", name)
	}
	return nil
}

// Extension matches.

func (c Comment) encode(w *exprWriter, _ Family) error {
	if len(c) > 255 || strings.IndexByte(string(c), 0) >= 0 {
		return invalidf("comment longer than 255 bytes or with NUL")
	}
	info := w.blob(256)
	copy(info, c)
	w.xt(xtComment, info)
	return nil
}

func (p Port) encode(w *exprWriter, _ Family) error {
	switch p.Proto {
	case ProtoTCP, ProtoUDP:
		if p.DPort == 0 {
			// Bare -m tcp or -m udp: the xt match with full port ranges.
			// xt_tcp is 12 bytes, xt_udp 10; both pad to 16.
			info := w.blob(16)
			binary.NativeEndian.PutUint16(info[2:], 0xffff)
			binary.NativeEndian.PutUint16(info[6:], 0xffff)
			x := xtTCP
			if p.Proto == ProtoUDP {
				x = xtUDP
			}
			w.xt(x, info)
			return nil
		}
		w.payload(payloadTransport, 2, 2)
		w.cmp(cmpEq, binary.BigEndian.AppendUint16(nil, p.DPort))
		return nil
	case ProtoSCTP:
		w.xt(xtSCTP, sctpInfo(w.blob(292), p.DPort))
		return nil
	}
	return invalidf("port match for protocol %d", p.Proto)
}

// sctpInfo returns struct xt_sctp_info (292 bytes) as libxt_sctp fills it.
func sctpInfo(info []byte, dport uint16) []byte {
	if dport != 0 {
		binary.NativeEndian.PutUint16(info[0:], dport)
		binary.NativeEndian.PutUint16(info[2:], dport)
		binary.NativeEndian.PutUint32(info[284:], 0x02) // XT_SCTP_DEST_PORTS
	}
	for i := range 4 {
		info[268+3*i] = 0xff // flag_info[i].chunktype
	}
	return info
}

func (s Statistic) encode(w *exprWriter, _ Family) error {
	info := w.blob(24)
	binary.NativeEndian.PutUint32(info[4:], s.Random)
	// libxt_statistic computes nth.count = every - packet, which for
	// random mode copies the probability into the count.
	binary.NativeEndian.PutUint32(info[12:], s.Random)
	w.xt(xtStatistic, info)
	return nil
}

// probabilityBits rounds a probability as libxt_statistic does.
func probabilityBits(p float64) uint32 {
	return uint32(math.Round(0x80000000 * p))
}

// Recent check_set bits.
const (
	recentCheck = 1 << 0
	recentSet   = 1 << 1
	recentReap  = 1 << 5
)

func (r Recent) encode(w *exprWriter, f Family) error {
	if r.Name == "" || len(r.Name) >= 200 || strings.ContainsAny(r.Name, "\x00/") {
		return invalidf("recent list name %q", r.Name)
	}
	info := w.blob(228)
	switch r.Mode {
	case RecentSet:
		info[8] = recentSet
	case RecentCheck:
		binary.NativeEndian.PutUint32(info[0:], r.Seconds)
		info[8] = recentCheck
		if r.Reap {
			info[8] |= recentReap
		}
	default:
		return invalidf("recent mode %d", r.Mode)
	}
	// libxt_recent starts from the name "DEFAULT" and copies the given
	// name with its NUL over it, so a shorter name leaves the rest of
	// "DEFAULT" behind the NUL.
	copy(info[10:], "DEFAULT")
	copy(info[10:], r.Name)
	info[10+len(r.Name)] = 0
	// side 0 is --rsource; the mask is the full address, as iptables
	// parses "--mask 255.255.255.255" (or all ones for IPv6).
	for i := range f.addrLen() {
		info[212+i] = 0xff
	}
	w.xt(xtRecent, info)
	return nil
}

func (m Mark) encode(w *exprWriter, _ Family) error {
	w.meta(metaMark)
	if m.Mask != 0xffffffff {
		w.bitwise(binary.NativeEndian.AppendUint32(nil, m.Mask), make([]byte, 4))
	}
	w.cmp(cmpOp(m.Invert), binary.NativeEndian.AppendUint32(nil, m.Value))
	return nil
}

func (a AddrType) encode(w *exprWriter, _ Family) error {
	info := w.blob(8)
	binary.NativeEndian.PutUint16(info[0:], a.Src)
	binary.NativeEndian.PutUint16(info[2:], a.Dst)
	var flags uint32
	if a.NotSrc {
		flags |= 1
	}
	if a.NotDst {
		flags |= 2
	}
	binary.NativeEndian.PutUint32(info[4:], flags)
	w.xt(xtAddrType, info)
	return nil
}

func (c Conntrack) encode(w *exprWriter, _ Family) error {
	// struct xt_conntrack_mtinfo3: addresses and masks (128 bytes), then
	// expiry, protocol and ports, then match_flags @146, invert_flags @148
	// and state_mask @150.
	info := w.blob(162)
	binary.NativeEndian.PutUint16(info[146:], 1) // XT_CONNTRACK_STATE
	if c.Invert {
		binary.NativeEndian.PutUint16(info[148:], 1)
	}
	binary.NativeEndian.PutUint16(info[150:], c.States)
	w.xt(xtConntrack, info)
	return nil
}

func (s Set) encode(w *exprWriter, _ Family) error {
	if len(s.Dirs) == 0 || len(s.Dirs) > 6 {
		return invalidf("set match with %d dimensions", len(s.Dirs))
	}
	if s.Name == "" || len(s.Name) >= 32 {
		return invalidf("set name %q", s.Name)
	}
	// struct xt_set_info_match_v4: index, dim, flags, then the packet and
	// byte counter matches, then cmdflags @40.
	info := w.blob(48)
	binary.NativeEndian.PutUint16(info[0:], s.Index)
	info[2] = byte(len(s.Dirs))
	for i, d := range s.Dirs {
		if d == SetSrc {
			info[3] |= 1 << (i + 1)
		}
	}
	if s.Invert {
		info[3] |= 1 // IPSET_INV_MATCH
	}
	w.xt(xtSet, info)
	return nil
}

// Targets.

func (j Jump) encode(w *exprWriter, _ Family) error {
	w.verdict(verdictJump, string(j))
	return nil
}

func (g Goto) encode(w *exprWriter, _ Family) error {
	w.verdict(verdictGoto, string(g))
	return nil
}

func (v Verdict) encode(w *exprWriter, _ Family) error {
	switch v {
	case Accept:
		w.verdict(verdictAccept, "")
	case Drop:
		w.verdict(verdictDrop, "")
	case Return:
		w.verdict(verdictReturn, "")
	default:
		return invalidf("verdict %q", string(v))
	}
	return nil
}

func (d DNAT) encode(w *exprWriter, f Family) error {
	if !d.To.Addr().IsValid() || FamilyOf(d.To.Addr()) != f || d.To.Port() == 0 {
		return invalidf("DNAT to %s in an %s table", d.To, f)
	}
	// struct nf_nat_range2: flags, min and max address, min, max and base
	// proto (ports in network byte order).
	info := w.blob(48)
	binary.NativeEndian.PutUint32(info[0:], 0x3) // MAP_IPS | PROTO_SPECIFIED
	a := d.To.Addr().AsSlice()
	copy(info[4:], a)
	copy(info[20:], a)
	binary.BigEndian.PutUint16(info[36:], d.To.Port())
	binary.BigEndian.PutUint16(info[38:], d.To.Port())
	w.xt(xtDNAT, info)
	return nil
}

func (m Masquerade) encode(w *exprWriter, f Family) error {
	var flags uint32
	if m.RandomFully {
		flags = 0x10 // NF_NAT_RANGE_PROTO_RANDOM_FULLY
	}
	if f == IPv6 {
		// struct nf_nat_range.
		info := w.blob(40)
		binary.NativeEndian.PutUint32(info, flags)
		w.xt(xtMasquerade, info)
		return nil
	}
	// struct nf_nat_ipv4_multi_range_compat with one range.
	info := w.blob(24)
	binary.NativeEndian.PutUint32(info[0:], 1)
	binary.NativeEndian.PutUint32(info[4:], flags)
	w.xt(xtMasquerade, info)
	return nil
}

func (m SetMark) encode(w *exprWriter, _ Family) error {
	info := w.blob(8)
	binary.NativeEndian.PutUint32(info[0:], m.Value)
	binary.NativeEndian.PutUint32(info[4:], m.Mask)
	w.xt(xtMark, info)
	return nil
}

func (Reject) encode(w *exprWriter, f Family) error {
	info := w.blob(4)
	with := uint32(3) // IPT_ICMP_PORT_UNREACHABLE
	if f == IPv6 {
		with = 4 // IP6T_ICMP6_PORT_UNREACH
	}
	binary.NativeEndian.PutUint32(info, with)
	w.xt(xtReject, info)
	return nil
}

func (j Jump) jumpsTo() string     { return string(j) }
func (g Goto) jumpsTo() string     { return string(g) }
func (Verdict) jumpsTo() string    { return "" }
func (DNAT) jumpsTo() string       { return "" }
func (Masquerade) jumpsTo() string { return "" }
func (SetMark) jumpsTo() string    { return "" }
func (Reject) jumpsTo() string     { return "" }
