//go:build linux

package nfnl

import (
	"encoding/binary"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// encoder appends nf_tables messages and attributes to one buffer, in
// internal/nl's framing: headers in host byte order, nf_tables values big
// endian.
type encoder struct {
	b   []byte
	err error
}

// message starts a message with an nfgenmsg header and returns its offset.
func (e *encoder) message(typ uint16, flags uint16, fam Family, resID uint16) int {
	off := len(e.b)
	e.b = nl.AppendHeader(e.b, typ, flags)
	e.b = binary.BigEndian.AppendUint16(append(e.b, byte(fam), 0), resID)
	return off
}

// endMessage writes the length of the message that starts at off.
func (e *encoder) endMessage(off int) { nl.PutLength(e.b[off:]) }

// fits reports whether an attribute of n bytes of payload can be framed,
// and records the error when not.
func (e *encoder) fits(typ uint16, n int) bool {
	if nl.AttrHeaderLen+n > nl.MaxAttrLen {
		e.fail(fmt.Errorf("attribute %d: %d bytes, at most %d", typ, nl.AttrHeaderLen+n, nl.MaxAttrLen))
		return false
	}
	return true
}

func (e *encoder) attr(typ uint16, v []byte) {
	if e.fits(typ, len(v)) {
		e.b = nl.Pad(append(nl.AppendAttrHeader(e.b, typ, len(v)), v...))
	}
}

func (e *encoder) str(typ uint16, s string) {
	if e.fits(typ, len(s)+1) {
		e.b = nl.Pad(append(append(nl.AppendAttrHeader(e.b, typ, len(s)+1), s...), 0))
	}
}

func (e *encoder) u32(typ uint16, v uint32) {
	e.b = binary.BigEndian.AppendUint32(nl.AppendAttrHeader(e.b, typ, 4), v)
}

func (e *encoder) u64(typ uint16, v uint64) {
	e.b = binary.BigEndian.AppendUint64(nl.AppendAttrHeader(e.b, typ, 8), v)
}

// nest starts a nested attribute and returns its offset for endNest.
func (e *encoder) nest(typ uint16) int {
	var off int
	e.b, off = nl.AppendNest(e.b, typ)
	return off
}

func (e *encoder) endNest(off int) {
	if !nl.EndNest(e.b, off) {
		e.fail(fmt.Errorf("nested attribute: %d bytes, at most %d", len(e.b)-off, nl.MaxAttrLen))
	}
}

func (e *encoder) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

// data writes an NFTA_DATA_VALUE nest holding v.
func (e *encoder) data(typ uint16, v []byte) {
	n := e.nest(typ)
	e.attr(attrDataValue, v)
	e.endNest(n)
}

// verdict writes an NFTA_DATA_VERDICT nest holding v.
func (e *encoder) verdict(typ uint16, v Verdict) {
	n := e.nest(typ)
	vn := e.nest(attrDataVerdict)
	e.u32(attrVerdictCode, uint32(v.Code))
	if v.Chain != "" {
		e.str(attrVerdictChain, v.Chain)
	}
	e.endNest(vn)
	e.endNest(n)
}

// attribute is one decoded attribute.
type attribute struct {
	typ  uint16
	data []byte
}

// attributes splits b into its attributes.
func attributes(b []byte) ([]attribute, error) {
	var out []attribute
	d := nl.NewDecoder(b)
	for d.Next() {
		out = append(out, attribute{typ: d.Type(), data: d.Bytes()})
	}
	return out, d.Err()
}

func (a attribute) str() string {
	s := a.data
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return string(s)
}

func (a attribute) u32() uint32 {
	if len(a.data) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(a.data)
}

func (a attribute) u64() uint64 {
	if len(a.data) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(a.data)
}

// value returns the content of an NFTA_DATA_VALUE nest.
func (a attribute) value() []byte {
	as, err := attributes(a.data)
	if err != nil {
		return nil
	}
	for _, x := range as {
		if x.typ == attrDataValue {
			return x.data
		}
	}
	return nil
}

// verdictOf returns the verdict of an NFTA_DATA_VERDICT nest, if any.
func (a attribute) verdictOf() *Verdict {
	as, err := attributes(a.data)
	if err != nil {
		return nil
	}
	for _, x := range as {
		if x.typ != attrDataVerdict {
			continue
		}
		vs, err := attributes(x.data)
		if err != nil {
			return nil
		}
		v := &Verdict{}
		for _, y := range vs {
			switch y.typ {
			case attrVerdictCode:
				v.Code = int32(y.u32())
			case attrVerdictChain:
				v.Chain = y.str()
			}
		}
		return v
	}
	return nil
}
