//go:build linux

package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// A rule is written twice from one description: as nft text, for Render,
// and as the netlink expressions nft itself would send for that text, so
// that what kproxy writes lists back exactly as the text it renders. The
// encodings below follow nft's (registers, byte order conversions, implicit
// protocol checks), which the tests compare against the real nft.
type rule struct {
	text  string
	exprs []expr.Any
	// raw is the rule's encoding, made once (encode) and reused by every
	// batch that writes the rule. A port's own rule (own) keeps no
	// encoding: a batch writes it once, when its chain is written, and
	// the chain goes by name, so the bytes would stay only to use memory.
	raw []nfnl.RawExpr
	own bool
	// terms, when set, are the rule's terms, each encoded: encode joins
	// their encodings.
	terms []term
	// kernel is the rule as the kernel dumped it, once it read back as
	// planned: later checks compare bytes (matches). A port's own rule
	// keeps none either.
	kernel []nfnl.RawExpr
}

// encode encodes the rule's expressions, once for a shared rule, each
// time for a port's own.
func (r *rule) encode() ([]nfnl.RawExpr, error) {
	if r.raw == nil && r.terms != nil {
		var raw []nfnl.RawExpr
		for _, t := range r.terms {
			raw = append(raw, t.raw...)
		}
		if r.own {
			return raw, nil
		}
		r.raw = raw
	}
	if r.raw == nil {
		raw, err := nfnl.EncodeExprs(nfnl.Inet, r.exprs)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r.text, err)
		}
		if r.own {
			return raw, nil
		}
		r.raw = raw
	}
	return r.raw, nil
}

// term is part of a rule: some text and the expressions behind it.
type term struct {
	text  string
	exprs []expr.Any
	// raw, when set, is the encoding of exprs, made once for a term that
	// many rules share (encoded).
	raw []nfnl.RawExpr
}

// encoded returns t with its encoding, for a term many rules share.
func encoded(t term) term {
	raw, err := nfnl.EncodeExprs(nfnl.Inet, t.exprs)
	if err == nil {
		t.raw = raw
	}
	return t
}

// mk makes a rule of terms. When every term with expressions comes
// encoded, the rule keeps them, and encodes by joining their encodings.
func mk(terms ...term) *rule {
	r := &rule{}
	var words []string
	encodedAll := true
	for _, t := range terms {
		if t.text != "" {
			words = append(words, t.text)
		}
		r.exprs = append(r.exprs, t.exprs...)
		encodedAll = encodedAll && (len(t.exprs) == 0 || t.raw != nil)
	}
	r.text = strings.Join(words, " ")
	if encodedAll {
		r.terms = terms
	}
	return r
}

// mkOwn makes a rule of one port's own, which no other port shares.
func mkOwn(terms ...term) *rule {
	r := mk(terms...)
	r.own = true
	return r
}

// Registers, numbered as the kernel dumps them: a 32-bit register whose
// index is a multiple of four is reported as the 16-byte register it
// starts (NFT_REG_1 = 1, NFT_REG_2 = 2, ...), the others as NFT_REG32_xx
// (8 + index). nft numbers them the same way.
func reg32(i int) uint32 {
	if i%4 == 0 {
		return uint32(1 + i/4)
	}
	return uint32(8 + i)
}

// concatRegs returns the register of each field of a concatenation whose
// fields are lens bytes long, each starting on a 32-bit register.
func concatRegs(lens ...int) []uint32 {
	out := make([]uint32, len(lens))
	i := 0
	for k, l := range lens {
		out[k] = reg32(i)
		i += (l + 3) / 4
	}
	return out
}

const reg1 = 1

func nfproto(f servicelb.Family) term {
	p := byte(unix.NFPROTO_IPV4)
	if f == servicelb.IPv6 {
		p = unix.NFPROTO_IPV6
	}
	return term{exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}}
}

func l4proto(p servicelb.Protocol) term {
	return term{text: "meta l4proto " + p.Lower(), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p.Number()}},
	}}
}

// ipFamily is "ip" or "ip6", as nft names the network header.
func ipFamily(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "ip6"
	}
	return "ip"
}

func addrLen(f servicelb.Family) int {
	if f == servicelb.IPv6 {
		return 16
	}
	return 4
}

// addrLoad loads the source or destination address into register r.
func addrLoad(f servicelb.Family, src bool, r uint32) expr.Any {
	off := uint32(16)
	switch {
	case f == servicelb.IPv4 && src:
		off = 12
	case f == servicelb.IPv6 && src:
		off = 8
	case f == servicelb.IPv6:
		off = 24
	}
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(addrLen(f))}
}

func addrWord(f servicelb.Family, src bool) string {
	if src {
		return ipFamily(f) + " saddr"
	}
	return ipFamily(f) + " daddr"
}

// inSet matches when the source or destination address is (or, negated,
// is not) in a set: "ip saddr != @pod-cidrs4".
func inSet(f servicelb.Family, src, negate bool, set string) term {
	op := ""
	if negate {
		op = "!= "
	}
	t := nfproto(f)
	t.text = fmt.Sprintf("%s %s@%s", addrWord(f, src), op, set)
	t.exprs = append(t.exprs, addrLoad(f, src, reg1), &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: negate})
	return t
}

// entryKey loads "ip daddr . meta l4proto . th dport" and, with saddr,
// ". ip saddr" after it. hton converts the protocol as nft does for a
// concatenation with intervals.
func entryKey(f servicelb.Family, saddr, hton bool) ([]expr.Any, string) {
	lens := []int{addrLen(f), 1, 2}
	if saddr {
		lens = append(lens, addrLen(f))
	}
	regs := concatRegs(lens...)
	es := []expr.Any{
		addrLoad(f, false, regs[0]),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
	}
	if hton {
		es = append(es, &expr.Byteorder{SourceRegister: regs[1], DestRegister: regs[1], Op: expr.ByteorderHton, Len: 1, Size: 2})
	}
	es = append(es, &expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	text := addrWord(f, false) + " . meta l4proto . th dport"
	if saddr {
		es = append(es, addrLoad(f, true, regs[3]))
		text += " . " + addrWord(f, true)
	}
	return es, text
}

// entryIn matches packets whose destination address, protocol and port are
// in set: "ip daddr . meta l4proto . th dport @firewall4".
func entryIn(f servicelb.Family, set string) term {
	t := nfproto(f)
	es, text := entryKey(f, false, false)
	t.exprs = append(t.exprs, es...)
	t.exprs = append(t.exprs, &expr.Lookup{SourceRegister: reg1, SetName: set})
	t.text = text + " @" + set
	return t
}

// entrySourceNotIn matches packets whose destination, protocol, port and
// source address are not in the interval set: the source range check.
func entrySourceNotIn(f servicelb.Family, set string) term {
	es, text := entryKey(f, true, true)
	return term{text: text + " != @" + set, exprs: append(es, &expr.Lookup{SourceRegister: reg1, SetName: set, Invert: true})}
}

// entryVmap dispatches on "ip daddr . meta l4proto . th dport vmap @set".
func entryVmap(f servicelb.Family, set string) term {
	t := nfproto(f)
	es, text := entryKey(f, false, false)
	t.exprs = append(t.exprs, es...)
	t.exprs = append(t.exprs, &expr.Lookup{SourceRegister: reg1, SetName: set, IsDestRegSet: true, DestRegister: 0})
	t.text = text + " vmap @" + set
	return t
}

func verdict(kind expr.VerdictKind, chain string) term {
	var text string
	switch kind {
	case expr.VerdictJump:
		text = "jump " + chain
	case expr.VerdictGoto:
		text = "goto " + chain
	case expr.VerdictDrop:
		text = "drop"
	case expr.VerdictAccept:
		text = "accept"
	case expr.VerdictReturn:
		text = "return"
	}
	return term{text: text, exprs: []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}}
}

func jump(chain string) term  { return verdict(expr.VerdictJump, chain) }
func goTo(chain string) term  { return verdict(expr.VerdictGoto, chain) }
func drop() term              { return verdict(expr.VerdictDrop, "") }
func returnVerdict() term     { return verdict(expr.VerdictReturn, "") }
func hostU32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
func bigU32(v uint32) []byte  { return binary.BigEndian.AppendUint32(nil, v) }
func fmtMark(v uint32) string { return fmt.Sprintf("0x%08x", v) }
func timeoutText(d time.Duration) string {
	return nftDuration(d)
}

// fibLocal matches packets from one of the node's own addresses, "fib
// saddr type local", or, negated, from any other address.
func fibLocal(local bool) term {
	text, op := "fib saddr type local", expr.CmpOpEq
	if !local {
		text, op = "fib saddr type != local", expr.CmpOpNeq
	}
	return term{text: text, exprs: []expr.Any{
		&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: op, Register: reg1, Data: hostU32(unix.RTN_LOCAL)},
	}}
}

// iifname matches packets that came in on the interface name (or, with
// prefix, on any interface whose name starts with name), or, negated, on
// any other interface or none: `iifname "cbr0"`, `iifname != "veth*"`. As
// nft encodes it, a name is compared with its padding to IFNAMSIZ bytes, a
// prefix with its own bytes only. A locally generated packet has no input
// interface: its name reads as all zeros.
func iifname(name string, prefix, negate bool) term {
	data := []byte(name)
	text := "iifname "
	if negate {
		text += "!= "
	}
	if prefix {
		text += `"` + name + `*"`
	} else {
		text += `"` + name + `"`
		data = append(data, make([]byte, unix.IFNAMSIZ-len(data))...)
	}
	op := expr.CmpOpEq
	if negate {
		op = expr.CmpOpNeq
	}
	return term{text: text, exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: data},
	}}
}

// markSetOr is "meta mark set meta mark | m".
func markSetOr(m uint32) term {
	return term{text: "meta mark set meta mark | " + fmtMark(m), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(^m), Xor: hostU32(m)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}}
}

// markSetXor is "meta mark set meta mark ^ m".
func markSetXor(m uint32) term {
	return term{text: "meta mark set meta mark ^ " + fmtMark(m), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(0xffffffff), Xor: hostU32(m)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}}
}

// markClear is "meta mark & m == 0".
func markClear(m uint32) term {
	return term{text: fmt.Sprintf("meta mark & %s == 0x00000000", fmtMark(m)), exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(m), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: hostU32(0)},
	}}
}

// ctDNAT is "ct status dnat": the connection's destination was translated.
func ctDNAT() term {
	return term{text: "ct status dnat", exprs: []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: hostU32(ctStatusDNAT), Xor: hostU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: hostU32(0)},
	}}
}

// hairpinIn is "ip saddr . ip daddr @set": a packet sent to its own source.
func hairpinIn(f servicelb.Family, set string) term {
	t := nfproto(f)
	regs := concatRegs(addrLen(f), addrLen(f))
	t.exprs = append(t.exprs, addrLoad(f, true, regs[0]), addrLoad(f, false, regs[1]), &expr.Lookup{SourceRegister: reg1, SetName: set})
	t.text = fmt.Sprintf("%s . %s @%s", addrWord(f, true), addrWord(f, false), set)
	return t
}

func masquerade() term {
	return term{text: "masquerade fully-random", exprs: []expr.Any{&expr.Masq{FullyRandom: true}}}
}

// reject answers with an ICMP (ICMPv6) port unreachable, TCP included, as
// nft encodes "reject": in a rule that has matched the network family
// (family is that family), with the ICMP type of the family; in any other
// (family is 0), with the family-neutral ICMPX code, which the kernel
// turns into the packet's own.
func reject(family servicelb.Family) term {
	switch family {
	case servicelb.IPv4:
		return term{text: "reject with icmp port-unreachable", exprs: []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}}}
	case servicelb.IPv6:
		return term{text: "reject with icmpv6 port-unreachable", exprs: []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}}}
	}
	return term{text: "reject", exprs: []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}}}
}

// numgenConst is "numgen random mod 1 offset v": a constant inside a
// concatenation, which nft cannot write as a literal there.
func numgenConst(r, v uint32) (expr.Any, string) {
	text := "numgen random mod 1"
	if v != 0 {
		text += fmt.Sprintf(" offset %d", v)
	}
	return &expr.Numgen{Register: r, Modulus: 1, Type: unix.NFT_NG_RANDOM, Offset: v}, text
}

// affinityKey loads "ip saddr . <slot> . <endpoint>" for the affinity set.
func affinityKey(f servicelb.Family, slot, ep uint32) ([]expr.Any, string) {
	regs := concatRegs(addrLen(f), 4, 4)
	a, at := numgenConst(regs[1], slot)
	b, bt := numgenConst(regs[2], ep)
	es := append(nfproto(f).exprs, addrLoad(f, true, regs[0]), a, b)
	return es, fmt.Sprintf("%s . %s . %s", addrWord(f, true), at, bt)
}

// affinityHit matches a client pinned to the endpoint:
// "ip saddr . <slot> . <endpoint> @affinity4".
func affinityHit(f servicelb.Family, set string, slot, ep uint32) term {
	es, text := affinityKey(f, slot, ep)
	return term{text: text + " @" + set, exprs: append(es, &expr.Lookup{SourceRegister: reg1, SetName: set})}
}

// affinityUpdate pins the client to the endpoint, or refreshes the pin.
func affinityUpdate(f servicelb.Family, set string, slot, ep uint32, timeout time.Duration) term {
	es, text := affinityKey(f, slot, ep)
	return term{
		text:  fmt.Sprintf("update @%s { %s timeout %s }", set, text, timeoutText(timeout)),
		exprs: append(es, &expr.Dynset{SrcRegKey: reg1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout}),
	}
}

// randomBelow matches with probability w/n: "numgen random mod n < w".
func randomBelow(n, w uint32) term {
	return term{text: fmt.Sprintf("numgen random mod %d < %d", n, w), exprs: []expr.Any{
		&expr.Numgen{Register: reg1, Modulus: n, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Cmp{Op: expr.CmpOpLt, Register: reg1, Data: bigU32(w)},
	}}
}

func natFamily(f servicelb.Family) uint32 {
	if f == servicelb.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// dnatTo translates the destination to one endpoint: "dnat ip to a:p".
func dnatTo(f servicelb.Family, to netip.AddrPort) term {
	// nft puts a literal address in register 1 and the port in register 2
	// (the second 16-byte register), for either family.
	text := fmt.Sprintf("dnat %s to %s", ipFamily(f), to)
	return term{text: text, exprs: []expr.Any{
		&expr.Immediate{Register: 1, Data: to.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily(f), RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
	}}
}

// protoIn matches packets whose protocol is in set: "meta l4proto @protocols4".
func protoIn(set string) term {
	return term{text: "meta l4proto @" + set, exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, SetName: set},
	}}
}

// dnatEndpoint translates the destination to the endpoint that the map
// set holds for the frontend and a bucket drawn at random from n buckets
// from from: "dnat ip to ip daddr . meta l4proto . th dport . numgen
// random mod n offset from map @endpoints4".
func dnatEndpoint(f servicelb.Family, n, from uint32, set string) term {
	regs := concatRegs(addrLen(f), 1, 2, 4)
	to := concatRegs(addrLen(f), 2)
	draw := fmt.Sprintf("numgen random mod %d", n)
	if from != 0 {
		draw += fmt.Sprintf(" offset %d", from)
	}
	return term{
		text: fmt.Sprintf("dnat %s to %s . meta l4proto . th dport . %s map @%s", ipFamily(f), addrWord(f, false), draw, set),
		exprs: []expr.Any{
			addrLoad(f, false, regs[0]),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regs[1]},
			&expr.Payload{DestRegister: regs[2], Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Numgen{Register: regs[3], Modulus: n, Type: unix.NFT_NG_RANDOM, Offset: from},
			&expr.Lookup{SourceRegister: reg1, SetName: set, IsDestRegSet: true, DestRegister: reg1},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: natFamily(f), RegAddrMin: to[0], RegAddrMax: to[0], RegProtoMin: to[1], RegProtoMax: to[1], Specified: true},
		},
	}
}

// nftDuration formats a duration as nft prints timeouts ("3h", "1h30m",
// "10s", "1s500ms").
func nftDuration(d time.Duration) string {
	ms := d.Milliseconds()
	if ms == 0 {
		return "0s"
	}
	var b strings.Builder
	for _, u := range []struct {
		n    int64
		unit string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if ms >= u.n {
			fmt.Fprintf(&b, "%d%s", ms/u.n, u.unit)
			ms %= u.n
		}
	}
	return b.String()
}

// ctStatusDNAT is the conntrack status bit of a translated destination
// (IPS_DST_NAT).
const ctStatusDNAT = 1 << 5
