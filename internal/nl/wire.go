package nl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
)

// Lengths of the framing.
const (
	// HeaderLen is the length of a message header (struct nlmsghdr).
	HeaderLen = 16
	// AttrHeaderLen is the length of an attribute header (struct nlattr).
	AttrHeaderLen = 4
	// MaxAttrLen is the longest attribute, header included, that the
	// 16-bit length of its header holds.
	MaxAttrLen = 0xffff
)

// Message types of netlink itself (NLMSG_*).
const (
	TypeNoop    = 0x1
	TypeError   = 0x2 // an acknowledgement or a refusal
	TypeDone    = 0x3 // the end of a dump
	TypeOverrun = 0x4
)

// Header flags (NLM_F_*): of every request, of a reply, of a GET
// request, of a NEW request, and of an NLMSG_ERROR.
const (
	Request  = 0x1
	Multi    = 0x2
	Ack      = 0x4
	Echo     = 0x8
	DumpIntr = 0x10 // a dump a concurrent change made inconsistent

	Root   = 0x100
	Match  = 0x200
	Atomic = 0x400
	Dump   = Root | Match

	Replace = 0x100
	Excl    = 0x200
	Create  = 0x400
	Append  = 0x800

	Capped  = 0x100 // the refused message's payload is left out
	AckTLVs = 0x200 // extended acknowledgement attributes follow
)

// Attribute type flags (NLA_F_*), and the mask that leaves the type.
const (
	Nested       = 0x8000
	NetByteOrder = 0x4000
	TypeMask     = 0x3fff
)

// Attributes of an extended acknowledgement (NLMSGERR_ATTR_*).
const (
	ackAttrMsg  = 1 // the kernel's explanation
	ackAttrOffs = 2 // the offset of the attribute it refused
)

// ErrMalformed: a message or attribute whose length is shorter than its
// header or runs past the bytes that hold it.
var ErrMalformed = errors.New("malformed netlink message")

// Align rounds n up to netlink's alignment of 4 bytes.
func Align(n int) int { return (n + 3) &^ 3 }

// Pad appends zeros to b up to netlink's alignment.
func Pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// AppendHeader appends a message header of type typ with flags; its
// length and sequence number are zero until PutLength and PutSeq set
// them, and its port id is zero: the kernel's.
func AppendHeader(b []byte, typ, flags uint16) []byte {
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return binary.NativeEndian.AppendUint32(b, 0)
}

// PutLength sets the length of the message m, all of m.
func PutLength(m []byte) { binary.NativeEndian.PutUint32(m, uint32(len(m))) }

// PutSeq sets the sequence number of the message that starts m.
func PutSeq(m []byte, seq uint32) { binary.NativeEndian.PutUint32(m[8:], seq) }

// TypeOf returns the type of the message that starts m.
func TypeOf(m []byte) uint16 { return binary.NativeEndian.Uint16(m[4:]) }

// FlagsOf returns the flags of the message that starts m.
func FlagsOf(m []byte) uint16 { return binary.NativeEndian.Uint16(m[6:]) }

// PutFlags sets the flags of the message that starts m.
func PutFlags(m []byte, f uint16) { binary.NativeEndian.PutUint16(m[6:], f) }

// LengthOf returns the length of the message that starts m, as its header
// gives it.
func LengthOf(m []byte) int { return int(binary.NativeEndian.Uint32(m)) }

// The fields of attribute headers, in host byte order.
func putAttrLen(b []byte, n int)          { binary.NativeEndian.PutUint16(b, uint16(n)) }
func attrLen(b []byte) int                { return int(binary.NativeEndian.Uint16(b)) }
func attrType(b []byte) uint16            { return binary.NativeEndian.Uint16(b[2:]) }
func appendU16(b []byte, v uint16) []byte { return binary.NativeEndian.AppendUint16(b, v) }

// AppendAttrHeader appends the header of an attribute of type typ (with
// its flags) whose payload is n bytes; the caller appends the payload and
// pads it. An attribute longer than MaxAttrLen cannot be framed: the
// caller checks that it fits.
func AppendAttrHeader(b []byte, typ uint16, n int) []byte {
	return appendU16(appendU16(b, uint16(AttrHeaderLen+n)), typ)
}

// AppendNest appends the header of a nested attribute of type typ
// (Nested is added) and returns where it starts, for EndNest.
func AppendNest(b []byte, typ uint16) ([]byte, int) {
	return AppendAttrHeader(b, typ|Nested, 0), len(b)
}

// EndNest sets the length of the nested attribute that starts at b[at:]
// to reach the end of b; false, and nothing set, when it is longer than
// MaxAttrLen.
func EndNest(b []byte, at int) bool {
	n := len(b) - at
	if n > MaxAttrLen {
		return false
	}
	putAttrLen(b[at:], n)
	return true
}

// Message is a received netlink message. Data, its payload after the
// header, points into the bytes it was read from.
type Message struct {
	Type, Flags uint16
	Seq         uint32
	Data        []byte
}

// Split splits a datagram into its messages; a tail shorter than a header
// is left.
func Split(b []byte) ([]Message, error) {
	var out []Message
	for len(b) >= HeaderLen {
		l := LengthOf(b)
		if l < HeaderLen || l > len(b) {
			return nil, fmt.Errorf("message of %d bytes in %d: %w", l, len(b), ErrMalformed)
		}
		out = append(out, Message{
			Type:  TypeOf(b),
			Flags: FlagsOf(b),
			Seq:   binary.NativeEndian.Uint32(b[8:]),
			Data:  b[HeaderLen:l],
		})
		b = b[min(len(b), Align(l)):]
	}
	return out, nil
}

// Decoder reads the attributes of a buffer one after another, as a
// bufio.Scanner reads lines: Next moves to the next attribute, Type and
// the value methods read it, and Err tells, once Next returned false,
// whether the buffer was malformed. A value read with the wrong length
// reads as zero and ends the decoding with an error.
type Decoder struct {
	// Order is the byte order of the values Uint16, Uint32 and Uint64
	// read: nil means the host's, in which most families send their
	// numbers; nf_tables, ipset and conntrack send theirs in network
	// order (binary.BigEndian).
	Order binary.ByteOrder

	b    []byte
	typ  uint16
	data []byte
	err  error
}

// NewDecoder returns a Decoder of the attributes in b, in host byte
// order.
func NewDecoder(b []byte) *Decoder { return &Decoder{b: b} }

// Next moves to the next attribute; false at the end of the buffer, at a
// malformed attribute, or after an error.
func (d *Decoder) Next() bool {
	if d.err != nil || len(d.b) < AttrHeaderLen {
		return false
	}
	n := attrLen(d.b)
	if n < AttrHeaderLen || n > len(d.b) {
		d.err = fmt.Errorf("attribute of %d bytes in %d: %w", n, len(d.b), ErrMalformed)
		return false
	}
	d.typ = attrType(d.b) & TypeMask
	d.data = d.b[AttrHeaderLen:n]
	d.b = d.b[min(len(d.b), Align(n)):]
	return true
}

// Type returns the attribute's type, without the Nested and
// NetByteOrder flags.
func (d *Decoder) Type() uint16 { return d.typ }

// Bytes returns the attribute's payload; it points into the buffer.
func (d *Decoder) Bytes() []byte { return d.data }

// Err returns the error that ended the decoding, if any.
func (d *Decoder) Err() error { return d.err }

func (d *Decoder) order() binary.ByteOrder {
	if d.Order == nil {
		return binary.NativeEndian
	}
	return d.Order
}

// fixed returns the payload when it has n bytes, else fails.
func (d *Decoder) fixed(n int) []byte {
	if len(d.data) != n {
		if d.err == nil {
			d.err = fmt.Errorf("attribute %d of %d bytes, want %d: %w", d.typ, len(d.data), n, ErrMalformed)
		}
		return nil
	}
	return d.data
}

// Uint8 returns a one-byte value.
func (d *Decoder) Uint8() uint8 {
	if v := d.fixed(1); v != nil {
		return v[0]
	}
	return 0
}

// Uint16 returns a 16-bit value in the Decoder's byte order.
func (d *Decoder) Uint16() uint16 {
	if v := d.fixed(2); v != nil {
		return d.order().Uint16(v)
	}
	return 0
}

// Uint32 returns a 32-bit value in the Decoder's byte order.
func (d *Decoder) Uint32() uint32 {
	if v := d.fixed(4); v != nil {
		return d.order().Uint32(v)
	}
	return 0
}

// Uint64 returns a 64-bit value in the Decoder's byte order.
func (d *Decoder) Uint64() uint64 {
	if v := d.fixed(8); v != nil {
		return d.order().Uint64(v)
	}
	return 0
}

// String returns a NUL-terminated string's value.
func (d *Decoder) String() string { return CString(d.data) }

// Nested decodes the attribute's payload as attributes, in the same byte
// order, with f; f's error, or a malformed payload, ends the outer
// decoding too.
func (d *Decoder) Nested(f func(*Decoder) error) {
	if d.err != nil {
		return
	}
	nd := &Decoder{Order: d.Order, b: d.data}
	err := f(nd)
	if err == nil {
		err = nd.err
	}
	if err != nil {
		d.err = err
	}
}

// Attrs iterates over the attributes in b: type (without the Nested and
// NetByteOrder flags) and payload. A malformed tail ends the iteration;
// a Decoder tells it.
func Attrs(b []byte) iter.Seq2[uint16, []byte] {
	return func(yield func(uint16, []byte) bool) {
		d := Decoder{b: b}
		for d.Next() {
			if !yield(d.typ, d.data) {
				return
			}
		}
	}
}

// CString returns the string up to the first NUL of b (all of b when it
// has none).
func CString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
