//go:build linux

package nfnl

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// encoder appends netlink messages and attributes to one buffer. Netlink
// headers and attribute headers are in host byte order (little endian on
// every architecture kproxy supports); nf_tables attribute values are big
// endian.
type encoder struct {
	b   []byte
	err error
}

func align4(n int) int { return (n + 3) &^ 3 }

// message starts a message with an nfgenmsg header and returns its offset.
func (e *encoder) message(typ uint16, flags uint16, fam Family, resID uint16) int {
	off := len(e.b)
	var h [nlmsgHdrLen + nfgenLen]byte
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
	h[16] = byte(fam)
	binary.BigEndian.PutUint16(h[18:], resID)
	e.b = append(e.b, h[:]...)
	return off
}

// endMessage writes the length of the message that starts at off.
func (e *encoder) endMessage(off int) {
	binary.NativeEndian.PutUint32(e.b[off:], uint32(len(e.b)-off))
}

func (e *encoder) attr(typ uint16, v []byte) {
	n := nlaHdrLen + len(v)
	if n > maxAttrLen {
		e.fail(fmt.Errorf("attribute %d: %d bytes, at most %d", typ, n, maxAttrLen))
		return
	}
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(n))
	binary.NativeEndian.PutUint16(h[2:], typ)
	e.b = append(e.b, h[:]...)
	e.b = append(e.b, v...)
	for pad := align4(n) - n; pad > 0; pad-- {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) str(typ uint16, s string) {
	n := nlaHdrLen + len(s) + 1
	if n > maxAttrLen {
		e.fail(fmt.Errorf("attribute %d: %d bytes, at most %d", typ, n, maxAttrLen))
		return
	}
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(n))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, s...)
	for pad := align4(n) - n + 1; pad > 0; pad-- {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) u32(typ uint16, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	e.attr(typ, b[:])
}

func (e *encoder) u64(typ uint16, v uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	e.attr(typ, b[:])
}

// nest starts a nested attribute and returns its offset for endNest.
func (e *encoder) nest(typ uint16) int {
	off := len(e.b)
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[2:], typ|nlaNested)
	e.b = append(e.b, h[:]...)
	return off
}

func (e *encoder) endNest(off int) {
	n := len(e.b) - off
	if n > maxAttrLen {
		e.fail(fmt.Errorf("nested attribute: %d bytes, at most %d", n, maxAttrLen))
		return
	}
	binary.NativeEndian.PutUint16(e.b[off:], uint16(n))
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

var errMalformed = errors.New("malformed netlink attributes")

// attributes splits b into its attributes.
func attributes(b []byte) ([]attribute, error) {
	var out []attribute
	for len(b) >= nlaHdrLen {
		n := int(binary.NativeEndian.Uint16(b[0:]))
		if n < nlaHdrLen || n > len(b) {
			return nil, errMalformed
		}
		out = append(out, attribute{typ: binary.NativeEndian.Uint16(b[2:]) & nlaTypeMask, data: b[nlaHdrLen:n]})
		a := align4(n)
		if a > len(b) {
			a = len(b)
		}
		b = b[a:]
	}
	return out, nil
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
