package nl

import (
	"encoding/binary"
	"net/netip"
)

// Batch is a list of netlink request messages, encoded as they are
// added. The zero value is an empty batch. Its builder methods never
// fail; an attribute too long for netlink's 16-bit length is a
// programming error and panics.
type Batch struct {
	buf []byte
	// starts holds the offset of each message in buf.
	starts []int
	// nests holds the offsets of the nested attributes still open.
	nests []int
}

// Message starts a request of type typ with flags (Request is added; Ack
// is the sender's to set) and the fixed part of its payload, such as a
// generic netlink header. Attributes added next belong to it.
func (b *Batch) Message(typ, flags uint16, fixed ...byte) {
	b.close()
	b.starts = append(b.starts, len(b.buf))
	b.buf = AppendHeader(b.buf, typ, flags|Request)
	b.buf = Pad(append(b.buf, fixed...))
}

// Attr adds an attribute with the given payload.
func (b *Batch) Attr(typ uint16, data []byte) {
	b.attrHeader(typ, len(data))
	b.buf = Pad(append(b.buf, data...))
}

// attrHeader appends the header of an attribute of n bytes.
func (b *Batch) attrHeader(typ uint16, n int) {
	if AttrHeaderLen+n > MaxAttrLen {
		panic("nl: attribute too long")
	}
	b.buf = AppendAttrHeader(b.buf, typ, n)
}

// Uint8 adds a one-byte attribute.
func (b *Batch) Uint8(typ uint16, v uint8) {
	b.attrHeader(typ, 1)
	b.buf = Pad(append(b.buf, v))
}

// Uint16 adds an attribute of a 16-bit value in host byte order.
func (b *Batch) Uint16(typ, v uint16) {
	b.attrHeader(typ, 2)
	b.buf = Pad(binary.NativeEndian.AppendUint16(b.buf, v))
}

// Uint32 adds an attribute of a 32-bit value in host byte order.
func (b *Batch) Uint32(typ uint16, v uint32) {
	b.attrHeader(typ, 4)
	b.buf = binary.NativeEndian.AppendUint32(b.buf, v)
}

// BigEndian16 adds an attribute of a 16-bit value in network byte order,
// such as a port. The NetByteOrder flag is the caller's to add, for the
// families that want it.
func (b *Batch) BigEndian16(typ, v uint16) {
	b.attrHeader(typ, 2)
	b.buf = Pad(binary.BigEndian.AppendUint16(b.buf, v))
}

// BigEndian32 adds an attribute of a 32-bit value in network byte order.
func (b *Batch) BigEndian32(typ uint16, v uint32) {
	b.attrHeader(typ, 4)
	b.buf = binary.BigEndian.AppendUint32(b.buf, v)
}

// String adds a NUL-terminated string attribute.
func (b *Batch) String(typ uint16, s string) {
	b.attrHeader(typ, len(s)+1)
	b.buf = Pad(append(append(b.buf, s...), 0))
}

// Addr adds an address attribute: 4 bytes for IPv4, 16 for IPv6.
func (b *Batch) Addr(typ uint16, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		b.Attr(typ, v[:])
		return
	}
	v := a.As16()
	b.Attr(typ, v[:])
}

// Nest opens a nested attribute (the Nested flag is the caller's to
// add); the attributes added until End are inside it.
func (b *Batch) Nest(typ uint16) {
	b.nests = append(b.nests, len(b.buf))
	b.buf = AppendAttrHeader(b.buf, typ, 0)
}

// End closes the nested attribute opened last.
func (b *Batch) End() {
	at := b.nests[len(b.nests)-1]
	b.nests = b.nests[:len(b.nests)-1]
	if !EndNest(b.buf, at) {
		panic("nl: nested attribute too long")
	}
}

// Len returns the number of messages.
func (b *Batch) Len() int { return len(b.starts) }

// Size returns the encoded size of the messages, in bytes.
func (b *Batch) Size() int { return len(b.buf) }

// Wire returns the encoded messages as they are sent, before they are
// numbered; the slice is the batch's own, valid until it changes.
func (b *Batch) Wire() []byte {
	b.close()
	return b.buf
}

// Reset empties the batch, keeping its memory.
func (b *Batch) Reset() {
	b.buf, b.starts, b.nests = b.buf[:0], b.starts[:0], b.nests[:0]
}

// close sets the length of the last message.
func (b *Batch) close() {
	if len(b.nests) > 0 {
		panic("nl: message ended with a nested attribute open")
	}
	if n := len(b.starts); n > 0 {
		PutLength(b.buf[b.starts[n-1]:])
	}
}

// message returns message i's bytes; the batch must be closed.
func (b *Batch) message(i int) []byte {
	end := len(b.buf)
	if i+1 < len(b.starts) {
		end = b.starts[i+1]
	}
	return b.buf[b.starts[i]:end]
}

// setHeader numbers message i and sets or clears its Ack flag.
func (b *Batch) setHeader(i int, seq uint32, ack bool) {
	m := b.buf[b.starts[i]:]
	f := FlagsOf(m)
	if ack {
		f |= Ack
	} else {
		f &^= Ack
	}
	PutFlags(m, f)
	PutSeq(m, seq)
}
