package xtables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

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

// parseAttrs splits b into attributes.
func parseAttrs(b []byte) ([]attribute, error) {
	var out []attribute
	for len(b) > 0 {
		a, rest, err := nextAttr(b)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
		b = rest
	}
	return out, nil
}

// nextAttr returns the first attribute of b and what follows it.
func nextAttr(b []byte) (attribute, []byte, error) {
	if len(b) < 4 {
		return attribute{}, nil, errMalformed
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n < 4 || n > len(b) {
		return attribute{}, nil, errMalformed
	}
	a := attribute{typ: binary.LittleEndian.Uint16(b[2:]) &^ 0xc000, data: b[4:n]}
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

// fromDump converts a dumped rule.
func fromDump(r *nfnl.Rule) (dumpedRule, error) {
	d := dumpedRule{chain: r.Chain, handle: r.Handle}
	var err error
	d.sig, d.jumpsTo, err = rawSig(r.Raw)
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
	raw, err := EncodeExprs(f, r)
	if err != nil {
		return 0, err
	}
	sig, _, err := rawSig(raw)
	return sig, err
}

// rawSig returns the canonical hash of a rule's expressions, and the
// chain its verdict jumps or goes to, if any.
func rawSig(raw []nfnl.RawExpr) (uint64, string, error) {
	h := fnv.New64a()
	var canon []byte
	var jump string
	var err error
	for _, x := range raw {
		canon, jump, err = appendCanonExpr(canon[:0], x.Name, x.Data, jump)
		if err != nil {
			return 0, "", fmt.Errorf("expression %s: %w", x.Name, err)
		}
		h.Write(canon)
	}
	return h.Sum64(), jump, nil
}

// appendCanonExpr appends a canonical form of one expression: its name,
// then its attributes sorted by type, nested ones canonical too.
func appendCanonExpr(b []byte, name string, data []byte, jump string) ([]byte, string, error) {
	b = append(b, name...)
	b = append(b, 0)
	if name == "counter" {
		return b, jump, nil
	}
	attrs, err := parseAttrs(data)
	if err != nil {
		return nil, "", err
	}
	slices.SortStableFunc(attrs, func(x, y attribute) int { return int(x.typ) - int(y.typ) })
	for _, a := range attrs {
		v := a.data
		switch {
		case (name == "match" || name == "target") && a.typ == attrXtInfo:
			v = bytes.TrimRight(v, "\x00")
		case name == "bitwise" && a.typ == 6 && attrU32(a) == 0:
			continue // NFTA_BITWISE_OP: the kernel reports the default
		case name == "immediate" && a.typ == attrImmData,
			name == "cmp" && a.typ == attrCmpData,
			name == "bitwise" && (a.typ == attrBitwiseMask || a.typ == attrBitwiseXor):
			var chain string
			v, chain, err = canonData(a.data)
			if err != nil {
				return nil, "", err
			}
			if chain != "" {
				jump = chain
			}
		}
		b = binary.LittleEndian.AppendUint16(b, a.typ)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	return b, jump, nil
}

// canonData canonicalises an NFTA_DATA nest (a value or a verdict) and
// returns the chain of a jump or goto verdict.
func canonData(b []byte) ([]byte, string, error) {
	attrs, err := parseAttrs(b)
	if err != nil {
		return nil, "", err
	}
	var out []byte
	var chain string
	for _, a := range attrs {
		v := a.data
		if a.typ == attrDataVerdict {
			va, err := parseAttrs(a.data)
			if err != nil {
				return nil, "", err
			}
			v = nil
			for _, x := range va {
				if x.typ == attrVerdictChan {
					chain = attrString(x)
				}
				v = binary.LittleEndian.AppendUint16(v, x.typ)
				v = append(v, bytes.TrimRight(x.data, "\x00")...)
			}
		}
		out = binary.LittleEndian.AppendUint16(out, a.typ)
		out = append(out, v...)
	}
	return out, chain, nil
}
