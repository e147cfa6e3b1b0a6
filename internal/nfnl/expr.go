//go:build linux

package nfnl

import (
	"bytes"
	"fmt"

	"github.com/google/nftables/expr"
)

// newExpr returns an empty expression of the github.com/google/nftables/expr
// type that handles the named kernel expression, or nil.
func newExpr(name string) expr.Any {
	switch name {
	case "bitwise":
		return &expr.Bitwise{}
	case "byteorder":
		return &expr.Byteorder{}
	case "cmp":
		return &expr.Cmp{}
	case "counter":
		return &expr.Counter{}
	case "ct":
		return &expr.Ct{}
	case "dynset":
		return &expr.Dynset{}
	case "fib":
		return &expr.Fib{}
	case "hash":
		return &expr.Hash{}
	case "immediate":
		return &expr.Immediate{}
	case "limit":
		return &expr.Limit{}
	case "log":
		return &expr.Log{}
	case "lookup":
		return &expr.Lookup{}
	case "masq":
		return &expr.Masq{}
	case "match":
		return &expr.Match{}
	case "meta":
		return &expr.Meta{}
	case "nat":
		return &expr.NAT{}
	case "notrack":
		return &expr.Notrack{}
	case "numgen":
		return &expr.Numgen{}
	case "payload":
		return &expr.Payload{}
	case "range":
		return &expr.Range{}
	case "redir":
		return &expr.Redir{}
	case "reject":
		return &expr.Reject{}
	case "target":
		return &expr.Target{}
	}
	return nil
}

// DecodeExpr parses one dumped expression into its
// github.com/google/nftables/expr type. Immediate expressions that hold a
// verdict become *expr.Verdict, as the library writes them.
func DecodeExpr(fam Family, x RawExpr) (expr.Any, error) {
	if x.Name == "byteorder" {
		// The library marshals byteorder but cannot read it back.
		return decodeByteorder(x.Data)
	}
	e := newExpr(x.Name)
	if e == nil {
		return nil, fmt.Errorf("nfnl: expression %q: unknown", x.Name)
	}
	if err := expr.Unmarshal(byte(fam), x.Data, e); err != nil {
		return nil, fmt.Errorf("nfnl: expression %q: %w", x.Name, err)
	}
	if imm, ok := e.(*expr.Immediate); ok && imm.Register == 0 {
		v := &expr.Verdict{}
		if err := expr.Unmarshal(byte(fam), x.Data, v); err == nil {
			return v, nil
		}
	}
	return e, nil
}

// Byteorder attributes (NFTA_BYTEORDER_*).
const (
	attrByteorderSreg = 1
	attrByteorderDreg = 2
	attrByteorderOp   = 3
	attrByteorderLen  = 4
	attrByteorderSize = 5
)

func decodeByteorder(data []byte) (expr.Any, error) {
	as, err := attributes(data)
	if err != nil {
		return nil, fmt.Errorf("nfnl: expression \"byteorder\": %w", err)
	}
	e := &expr.Byteorder{}
	for _, a := range as {
		switch a.typ {
		case attrByteorderSreg:
			e.SourceRegister = a.u32()
		case attrByteorderDreg:
			e.DestRegister = a.u32()
		case attrByteorderOp:
			e.Op = expr.ByteorderOp(a.u32())
		case attrByteorderLen:
			e.Len = a.u32()
		case attrByteorderSize:
			e.Size = a.u32()
		}
	}
	return e, nil
}

// DecodeExprs decodes every expression of a dumped rule; it stops at the
// first one it cannot decode.
func DecodeExprs(fam Family, raw []RawExpr) ([]expr.Any, error) {
	out := make([]expr.Any, 0, len(raw))
	for _, x := range raw {
		e, err := DecodeExpr(fam, x)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// MarshalExprs returns the kernel encoding of each expression, as a rule
// carries them in its NFTA_RULE_EXPRESSIONS list.
func MarshalExprs(fam Family, es []expr.Any) ([][]byte, error) {
	out := make([][]byte, 0, len(es))
	for i, e := range es {
		b, err := expr.Marshal(byte(fam), e)
		if err != nil {
			return nil, fmt.Errorf("nfnl: expression %d (%T): %w", i, e, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// SameExprs reports whether a dumped rule holds the given expressions. It
// decodes the dump and marshals both sides the same way, so that attribute
// order and the attributes the kernel adds or drops do not matter as long
// as the library reads them back into the same values.
func SameExprs(fam Family, raw []RawExpr, want []expr.Any) bool {
	if len(raw) != len(want) {
		return false
	}
	got, err := DecodeExprs(fam, raw)
	if err != nil {
		return false
	}
	a, err := MarshalExprs(fam, got)
	if err != nil {
		return false
	}
	b, err := MarshalExprs(fam, want)
	if err != nil {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// EncodeExprs marshals expressions into the raw form a Rule carries in Raw,
// so that a writer can encode a rule once and add it to many batches.
func EncodeExprs(fam Family, es []expr.Any) ([]RawExpr, error) {
	out := make([]RawExpr, 0, len(es))
	for i, e := range es {
		b, err := expr.Marshal(byte(fam), e)
		if err != nil {
			return nil, fmt.Errorf("nfnl: expression %d (%T): %w", i, e, err)
		}
		as, err := attributes(b)
		if err != nil {
			return nil, fmt.Errorf("nfnl: expression %d (%T): %w", i, e, err)
		}
		var x RawExpr
		for _, a := range as {
			switch a.typ {
			case attrExprName:
				x.Name = a.str()
			case attrExprData:
				x.Data = a.data
			}
		}
		out = append(out, x)
	}
	return out, nil
}
