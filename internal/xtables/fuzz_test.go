//go:build linux

package xtables

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// FuzzSignature: the signature of dumped expressions never panics on what
// the kernel might send, and does not depend on the order of an
// expression's attributes (the kernel dumps them in its own order).
func FuzzSignature(f *testing.F) {
	for _, r := range []Rule{
		{Dst: netip.MustParsePrefix("10.96.0.10/32"), Proto: ProtoTCP,
			Matches: []Match{Comment("default/web:http"), Port{ProtoTCP, 80}}, Target: Jump("KPROXY-SVC-X")},
		{Target: OrMark(0x4000)},
		{Matches: []Match{Comment("masquerade")}, Target: Return},
	} {
		var w exprWriter
		if err := encodeRule(&w, IPv4, &r); err != nil {
			f.Fatal(err)
		}
		f.Add(w.b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		raw, err := splitExprs(nil, b)
		if err != nil {
			return
		}
		sig, jump, err := rawSig(raw)
		if err != nil {
			return
		}
		for i := range raw {
			rev, ok := reversed(raw[i].Data)
			if !ok {
				return
			}
			raw[i].Data = rev
		}
		sig2, jump2, err := rawSig(raw)
		if err != nil || sig2 != sig || jump2 != jump {
			t.Fatalf("attributes in reverse order: signature %x, %q, %v; want %x, %q", sig2, jump2, err, sig, jump)
		}
	})
}

// reversed returns the attributes of b in reverse order, or false when
// they do not parse or two share a type (whose order counts).
func reversed(b []byte) ([]byte, bool) {
	var attrs [][]byte
	seen := map[uint16]bool{}
	for len(b) > 0 {
		a, rest, err := nextAttr(b)
		if err != nil || seen[a.typ] {
			return nil, false
		}
		seen[a.typ] = true
		n := int(binary.NativeEndian.Uint16(b))
		attrs = append(attrs, b[:n])
		b = rest
	}
	var out []byte
	for i := len(attrs) - 1; i >= 0; i-- {
		out = append(out, attrs[i]...)
		for len(out)%4 != 0 {
			out = append(out, 0)
		}
	}
	return out, true
}
