package nl

import (
	"encoding/binary"
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecoder(t *testing.T) {
	var b Batch
	b.Uint8(1, 7)
	b.BigEndian16(2, 80)
	b.BigEndian32(3|NetByteOrder, 0x01020304)
	b.Attr(4, binary.BigEndian.AppendUint64(nil, 1<<40))
	b.String(5, "kproxy")
	b.Nest(6 | Nested)
	b.Uint32(1, 42)
	b.End()

	d := NewDecoder(b.buf)
	d.Order = binary.BigEndian
	var got []any
	for d.Next() {
		switch d.Type() {
		case 1:
			got = append(got, d.Uint8())
		case 2:
			got = append(got, d.Uint16())
		case 3:
			got = append(got, d.Uint32())
		case 4:
			got = append(got, d.Uint64())
		case 5:
			got = append(got, d.String())
		case 6:
			d.Nested(func(nd *Decoder) error {
				nd.Order = nil // the nest's values are the host's
				for nd.Next() {
					got = append(got, nd.Uint32())
				}
				return nil
			})
		}
	}
	require.NoError(t, d.Err())
	assert.Equal(t, []any{uint8(7), uint16(80), uint32(0x01020304), uint64(1 << 40), "kproxy", uint32(42)}, got)
}

func TestDecoderErrors(t *testing.T) {
	var b Batch
	b.Uint16(1, 5)
	d := NewDecoder(b.buf)
	require.True(t, d.Next())
	assert.Zero(t, d.Uint32(), "a value of the wrong length reads as zero")
	assert.ErrorIs(t, d.Err(), ErrMalformed)
	assert.False(t, d.Next(), "an error ends the decoding")

	b.Reset()
	b.Uint8(1, 1)
	b.buf = append(b.buf, 0xff, 0x00, 2, 0) // a length past the end
	d = NewDecoder(b.buf)
	require.True(t, d.Next())
	assert.False(t, d.Next())
	assert.ErrorIs(t, d.Err(), ErrMalformed)

	b.Reset()
	b.Nest(1)
	b.Uint8(2, 1)
	b.End()
	d = NewDecoder(b.buf)
	require.True(t, d.Next())
	inner := errors.New("refused by the caller")
	d.Nested(func(*Decoder) error { return inner })
	assert.ErrorIs(t, d.Err(), inner, "a nest's error is the outer decoder's")
}

// ack returns an NLMSG_ERROR or NLMSG_DONE message numbered seq carrying
// errno (0: an acknowledgement, or a dump's plain end).
func ack(typ uint16, seq uint32, errno syscall.Errno) Message {
	data := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	if typ == TypeError {
		data = append(data, make([]byte, HeaderLen)...)
	}
	return Message{Type: typ, Seq: seq, Data: data}
}

// TestAnswer: how an answer ends, whatever the family: a dump whose
// NLMSG_DONE carries an errno was cut short by the kernel and fails.
func TestAnswer(t *testing.T) {
	part := func(seq uint32, flags uint16) Message { return Message{Type: 100, Flags: flags | Multi, Seq: seq} }
	for _, tc := range []struct {
		name  string
		msgs  []Message
		fails error // f's error
		calls int
		want  error
	}{
		{name: "dump", msgs: []Message{part(7, 0), part(7, 0), ack(TypeDone, 7, 0)}, calls: 2},
		{name: "another request's messages are passed over",
			msgs: []Message{part(6, 0), ack(TypeDone, 6, syscall.EINVAL), part(7, 0), ack(TypeDone, 7, 0)}, calls: 1},
		{name: "a dump cut short", msgs: []Message{part(7, 0), ack(TypeDone, 7, syscall.ENOBUFS)}, calls: 1,
			want: syscall.ENOBUFS},
		{name: "an old kernel's plain end", msgs: []Message{part(7, 0), {Type: TypeDone, Seq: 7}}, calls: 1},
		{name: "interrupted", msgs: []Message{part(7, 0), part(7, DumpIntr), ack(TypeDone, 7, 0)}, calls: 2,
			want: ErrDumpInterrupted},
		{name: "refused", msgs: []Message{ack(TypeError, 7, syscall.EPERM)}, want: syscall.EPERM},
		{name: "reply and acknowledgement", msgs: []Message{part(7, 0), ack(TypeError, 7, 0)}, calls: 1},
		{name: "the caller's error stops the calls, not the reading",
			msgs: []Message{part(7, 0), part(7, 0), ack(TypeDone, 7, 0)}, fails: syscall.EBADMSG, calls: 1,
			want: syscall.EBADMSG},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			a := answer{seq: 7, f: func(Message) error { calls++; return tc.fails }}
			var err error
			done := false
			for i, m := range tc.msgs {
				require.False(t, done, "ended before message %d", i)
				done, err = a.take(m)
			}
			require.True(t, done, "the answer ended")
			assert.Equal(t, tc.calls, calls)
			if tc.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.want)
			}
		})
	}
}
