//go:build linux

package xtables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// errMalformed reports a netlink message or attribute that does not parse.
var errMalformed = errors.New("malformed netlink data")

// attribute is one netlink attribute: its type without flag bits and its
// payload.
type attribute struct {
	typ  uint16
	data []byte
}

// nextAttr returns the first attribute of b and what follows it.
func nextAttr(b []byte) (attribute, []byte, error) {
	if len(b) < 4 {
		return attribute{}, nil, errMalformed
	}
	n := int(binary.NativeEndian.Uint16(b))
	if n < 4 || n > len(b) {
		return attribute{}, nil, errMalformed
	}
	a := attribute{typ: binary.NativeEndian.Uint16(b[2:]) &^ 0xc000, data: b[4:n]}
	return a, b[min((n+3)&^3, len(b)):], nil
}

func attrU32(a attribute) uint32 {
	if len(a.data) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.data)
}

func attrString(a attribute) string {
	return string(bytes.TrimRight(a.data, "\x00"))
}

// dumpedRule is a rule as the kernel lists it.
type dumpedRule struct {
	chain   string
	handle  uint64
	sig     uint64
	jumpsTo string
}

// signer computes signatures, reusing its buffers.
type signer struct {
	w     exprWriter
	raw   []nfnl.RawExpr
	canon []byte
}

// fromDump converts a dumped rule.
func (s *signer) fromDump(r *nfnl.Rule) (dumpedRule, error) {
	d := dumpedRule{chain: r.Chain, handle: r.Handle}
	var err error
	d.sig, d.jumpsTo, err = s.rawSig(r.Raw)
	if len(r.UserData) > 0 {
		// iptables-nft writes no user data: not a rule of ours.
		d.sig ^= 0x9e3779b97f4a7c15
	}
	return d, err
}

// Signature returns a hash of the rule's expressions that is equal for the
// rule as encoded here and as the kernel dumps it back: counter values are
// left out, and xt info blobs are compared without trailing zeros (the
// kernel dumps some of them shorter).
func Signature(f Family, r *Rule) (uint64, error) {
	var s signer
	return s.sig(f, r)
}

// sig is Signature with s's buffers.
func (s *signer) sig(f Family, r *Rule) (uint64, error) {
	s.w.b = s.w.b[:0]
	if err := encodeRule(&s.w, f, r); err != nil {
		return 0, err
	}
	raw, err := splitExprs(s.raw[:0], s.w.b)
	if err != nil {
		return 0, err
	}
	s.raw = raw
	sig, _, err := s.rawSig(raw)
	return sig, err
}

// rawSig returns the canonical hash of a rule's expressions, and the
// chain its verdict jumps or goes to, if any.
func rawSig(raw []nfnl.RawExpr) (uint64, string, error) {
	var s signer
	return s.rawSig(raw)
}

func (s *signer) rawSig(raw []nfnl.RawExpr) (uint64, string, error) {
	h := fnvOffset
	var jump string
	var err error
	for _, x := range raw {
		s.canon, jump, err = appendCanonExpr(s.canon[:0], x.Name, x.Data, jump)
		if err != nil {
			return 0, "", fmt.Errorf("expression %s: %w", x.Name, err)
		}
		for _, c := range s.canon {
			h = (h ^ uint64(c)) * fnvPrime
		}
	}
	return h, jump, nil
}

// FNV-1a, 64 bits.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

// appendCanonExpr appends a canonical form of one expression: its name,
// then its attributes sorted by type, nested ones canonical too. It
// allocates nothing but b's growth (and the jump target's name).
func appendCanonExpr(b []byte, name string, data []byte, jump string) ([]byte, string, error) {
	b = append(b, name...)
	b = append(b, 0)
	if name == "counter" {
		return b, jump, nil
	}
	var arr [16]attribute
	attrs := arr[:0]
	for len(data) > 0 {
		a, rest, err := nextAttr(data)
		if err != nil {
			return nil, "", err
		}
		if len(attrs) == len(arr) {
			return nil, "", errMalformed
		}
		attrs = append(attrs, a)
		data = rest
	}
	for i := 1; i < len(attrs); i++ { // insertion sort: a handful, mostly sorted
		for j := i; j > 0 && attrs[j].typ < attrs[j-1].typ; j-- {
			attrs[j], attrs[j-1] = attrs[j-1], attrs[j]
		}
	}
	for _, a := range attrs {
		if name == "bitwise" && a.typ == 6 && attrU32(a) == 0 {
			continue // NFTA_BITWISE_OP: the kernel reports the default
		}
		b = binary.NativeEndian.AppendUint16(b, a.typ)
		lenAt := len(b)
		b = append(b, 0, 0, 0, 0)
		switch {
		case (name == "match" || name == "target") && a.typ == attrXtInfo:
			b = append(b, bytes.TrimRight(a.data, "\x00")...)
		case name == "immediate" && a.typ == attrImmData,
			name == "cmp" && a.typ == attrCmpData,
			name == "bitwise" && (a.typ == attrBitwiseMask || a.typ == attrBitwiseXor):
			var err error
			if b, jump, err = appendCanonData(b, a.data, jump); err != nil {
				return nil, "", err
			}
		default:
			b = append(b, a.data...)
		}
		binary.NativeEndian.PutUint32(b[lenAt:], uint32(len(b)-lenAt-4))
	}
	return b, jump, nil
}

// appendCanonData appends a canonical NFTA_DATA nest (a value or a
// verdict), and returns the chain of a jump or goto verdict, else jump.
func appendCanonData(b, data []byte, jump string) ([]byte, string, error) {
	for len(data) > 0 {
		a, rest, err := nextAttr(data)
		if err != nil {
			return nil, "", err
		}
		data = rest
		b = binary.NativeEndian.AppendUint16(b, a.typ)
		if a.typ != attrDataVerdict {
			b = append(b, a.data...)
			continue
		}
		for v := a.data; len(v) > 0; {
			x, rest, err := nextAttr(v)
			if err != nil {
				return nil, "", err
			}
			v = rest
			if x.typ == attrVerdictChan {
				jump = attrString(x)
			}
			b = binary.NativeEndian.AppendUint16(b, x.typ)
			b = append(b, bytes.TrimRight(x.data, "\x00")...)
		}
	}
	return b, jump, nil
}
