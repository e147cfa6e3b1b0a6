//go:build linux

package xtables

import (
	"bytes"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// msgWriter adds iptables-nft's messages to an nfnl batch.
type msgWriter struct {
	b   nfnl.Batch
	enc exprWriter     // scratch space for rule expressions
	raw []nfnl.RawExpr // scratch for their split, for signatures
}

// count returns the number of messages so far.
func (m *msgWriter) count() int { return m.b.Len() }

// last returns the index of the last message.
func (m *msgWriter) last() int { return m.b.Len() - 1 }

// newTable creates table t if it does not exist.
func (m *msgWriter) newTable(t Table) {
	m.b.AddTable(nfnl.Table{Family: nfnl.Family(t.Family), Name: string(t.Name)})
}

// newBaseChain creates a builtin chain as iptables-nft does, policy accept.
func (m *msgWriter) newBaseChain(t Table, bc BaseChain) {
	accept := int32(verdictAccept)
	m.b.AddChain(nfnl.Chain{Family: nfnl.Family(t.Family), Table: string(t.Name), Name: bc.Name,
		Hook: &nfnl.Hook{Num: bc.Hook, Priority: bc.Priority, Type: bc.Type, Policy: &accept}})
}

// newChain creates a user chain.
func (m *msgWriter) newChain(t Table, name string) {
	m.b.AddChain(nfnl.Chain{Family: nfnl.Family(t.Family), Table: string(t.Name), Name: name})
}

// delChain deletes an empty user chain.
func (m *msgWriter) delChain(t Table, name string) {
	m.b.DelChain(nfnl.Family(t.Family), string(t.Name), name)
}

// flushChain deletes every rule of a chain.
func (m *msgWriter) flushChain(t Table, name string) {
	m.b.FlushChain(nfnl.Family(t.Family), string(t.Name), name)
}

// delRule deletes one rule by handle.
func (m *msgWriter) delRule(t Table, chain string, handle uint64) {
	m.b.DelRule(nfnl.Family(t.Family), string(t.Name), chain, handle)
}

// position says where a new rule goes in its chain.
type position struct {
	kind   posKind
	handle uint64 // for posBeforeHandle
}

type posKind uint8

const (
	posAppend posKind = iota
	posHead
	posBeforeHandle
)

// addRule adds r to chain at pos, encoding its expressions straight
// into the message. It returns them encoded (the contents of
// NFTA_RULE_EXPRESSIONS), valid until the next call.
func (m *msgWriter) addRule(t Table, chain string, r *Rule, pos position) ([]byte, error) {
	m.enc.b = m.enc.b[:0]
	if err := encodeRule(&m.enc, t.Family, r); err != nil {
		return nil, err
	}
	var flags uint32
	if r.NotProto {
		flags = compatInvert
	}
	nr := nfnl.Rule{Family: nfnl.Family(t.Family), Table: string(t.Name), Chain: chain, Encoded: m.enc.b,
		Compat: &nfnl.Compat{Proto: uint32(r.Proto), Flags: flags}}
	switch pos.kind {
	case posAppend:
		m.b.AddRule(nr)
	case posHead:
		m.b.InsertRule(nr)
	case posBeforeHandle:
		nr.Position = pos.handle
		m.b.InsertRule(nr)
	}
	return m.enc.b, nil
}

const compatInvert = 1 << 1 // NFT_RULE_COMPAT_F_INV

// encodeRaw encodes r into w's buffer (reset first) and returns its
// expressions, which point into the buffer until the next call.
func encodeRaw(w *exprWriter, f Family, r *Rule) ([]nfnl.RawExpr, error) {
	w.b = w.b[:0]
	if err := encodeRule(w, f, r); err != nil {
		return nil, err
	}
	return splitExprs(nil, w.b)
}

// splitExprs appends the expressions in b, the contents of
// NFTA_RULE_EXPRESSIONS, to out. Their data points into b.
func splitExprs(out []nfnl.RawExpr, b []byte) ([]nfnl.RawExpr, error) {
	for len(b) > 0 {
		el, rest, err := nextAttr(b)
		if err != nil {
			return nil, err
		}
		b = rest
		var x nfnl.RawExpr
		for len(el.data) > 0 {
			a, rest, err := nextAttr(el.data)
			if err != nil {
				return nil, err
			}
			el.data = rest
			switch a.typ {
			case attrExprName:
				x.Name = exprName(a.data)
			case attrExprData:
				x.Data = a.data
			}
		}
		out = append(out, x)
	}
	return out, nil
}

// exprName returns an expression's name from its NUL-terminated
// attribute, without allocating for the names the encoder writes.
func exprName(b []byte) string {
	b = bytes.TrimRight(b, "\x00")
	for _, n := range []string{"match", "target", "meta", "cmp", "payload", "counter", "immediate", "bitwise"} {
		if string(b) == n {
			return n
		}
	}
	return string(b)
}

// EncodeExprs returns the expressions iptables-nft writes for r in a
// table of family f, as nfnl writes and dumps them.
func EncodeExprs(f Family, r *Rule) ([]nfnl.RawExpr, error) {
	var w exprWriter
	raw, err := encodeRaw(&w, f, r)
	if err != nil {
		return nil, err
	}
	return raw, nil
}
