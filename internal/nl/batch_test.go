//go:build linux

package nl

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// attr is one decoded attribute, nested ones decoded too.
type attr struct {
	Type   uint16
	Value  []byte
	Nested []attr
}

func decode(b []byte, nested map[uint16]bool) []attr {
	var out []attr
	for typ, v := range Attrs(b) {
		a := attr{Type: typ, Value: slices.Clone(v)}
		if nested[typ] {
			a.Value, a.Nested = nil, decode(v, nil)
		}
		out = append(out, a)
	}
	return out
}

func TestBatchEncoding(t *testing.T) {
	var b Batch
	b.Message(20, unix.NLM_F_CREATE, 1, 2, 3) // a fixed part of 3 bytes, padded
	b.Uint8(1, 7)
	b.Uint16(2, 0x0102)
	b.Uint32(3, 0x01020304)
	b.BigEndian16(4, 80)
	b.String(5, "wrr")
	b.Nest(6)
	b.Addr(1, netip.MustParseAddr("10.0.0.1"))
	b.Addr(2, netip.MustParseAddr("fd00::1"))
	b.End()
	b.Message(21, 0)
	b.close()

	require.Equal(t, 2, b.Len())
	m := b.message(0)
	require.Equal(t, len(m), int(binary.NativeEndian.Uint32(m)), "length of the first message")
	assert.Equal(t, uint16(20), binary.NativeEndian.Uint16(m[4:]))
	assert.Equal(t, uint16(unix.NLM_F_REQUEST|unix.NLM_F_CREATE), binary.NativeEndian.Uint16(m[6:]))
	assert.Equal(t, []byte{1, 2, 3, 0}, m[HeaderLen:HeaderLen+4])
	ne16 := binary.NativeEndian.AppendUint16(nil, 0x0102)
	ne32 := binary.NativeEndian.AppendUint32(nil, 0x01020304)
	want := []attr{
		{Type: 1, Value: []byte{7}},
		{Type: 2, Value: ne16},
		{Type: 3, Value: ne32},
		{Type: 4, Value: []byte{0, 80}},
		{Type: 5, Value: []byte("wrr\x00")},
		{Type: 6, Nested: []attr{
			{Type: 1, Value: []byte{10, 0, 0, 1}},
			{Type: 2, Value: netip.MustParseAddr("fd00::1").AsSlice()},
		}},
	}
	assert.Equal(t, want, decode(m[HeaderLen+4:], map[uint16]bool{6: true}))
	assert.Zero(t, len(m)%4, "messages are aligned")

	m2 := b.message(1)
	assert.Equal(t, HeaderLen, int(binary.NativeEndian.Uint32(m2)))

	b.setHeader(1, 42, true)
	assert.Equal(t, uint32(42), binary.NativeEndian.Uint32(m2[8:]))
	assert.NotZero(t, binary.NativeEndian.Uint16(m2[6:])&unix.NLM_F_ACK)
	b.setHeader(1, 43, false)
	assert.Zero(t, binary.NativeEndian.Uint16(m2[6:])&unix.NLM_F_ACK)

	b.Reset()
	assert.Zero(t, b.Len())
	assert.Zero(t, b.Size())
}

func TestChunks(t *testing.T) {
	var b Batch
	for range 10 {
		b.Message(20, 0)
		b.Attr(1, make([]byte, 12)) // 16 + 16 bytes a message
	}
	b.Message(20, 0)
	b.Attr(1, make([]byte, 200)) // longer than a chunk: goes alone
	b.Message(20, 0)
	b.close()
	c := &Conn{chunk: 100}
	var ends []int
	for lo := 0; lo < b.Len(); lo = ends[len(ends)-1] {
		ends = append(ends, c.chunkEnd(&b, lo))
	}
	assert.Equal(t, []int{3, 6, 9, 10, 11, 12}, ends)
}

func TestParseAck(t *testing.T) {
	ack := binary.NativeEndian.AppendUint32(nil, 0)
	ack = append(ack, make([]byte, HeaderLen)...)
	assert.NoError(t, ParseAck(Message{Type: unix.NLMSG_ERROR, Data: ack}))

	code := int32(-int32(unix.EEXIST))
	refusal := binary.NativeEndian.AppendUint32(nil, uint32(code))
	refusal = append(refusal, make([]byte, HeaderLen)...) // the capped original header
	var tlv Batch
	tlv.buf = refusal
	tlv.String(unix.NLMSGERR_ATTR_MSG, "Address already assigned")
	tlv.Uint32(unix.NLMSGERR_ATTR_OFFS, 36)
	err := ParseAck(Message{Type: unix.NLMSG_ERROR, Flags: unix.NLM_F_CAPPED | unix.NLM_F_ACK_TLVS, Data: tlv.buf})
	require.ErrorIs(t, err, unix.EEXIST)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "Address already assigned", e.Text)
	assert.Equal(t, 36, e.Offset, "where the refused attribute starts")
	assert.Equal(t, syscall.EEXIST.Error()+": Address already assigned", err.Error())

	assert.ErrorIs(t, ParseAck(Message{Type: unix.NLMSG_ERROR}), unix.EPROTO)
}

func TestSplit(t *testing.T) {
	var b Batch
	b.Message(20, 0)
	b.Uint8(1, 1)
	b.Message(21, unix.NLM_F_MULTI)
	b.close()
	b.setHeader(0, 5, false)
	b.setHeader(1, 6, false)
	msgs, err := Split(b.buf)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	assert.Equal(t, uint32(5), msgs[0].Seq)
	assert.Equal(t, uint16(21), msgs[1].Type)
	assert.Len(t, msgs[0].Data, 8)

	_, err = Split(append(binary.NativeEndian.AppendUint32(nil, 1000), make([]byte, 12)...))
	assert.ErrorIs(t, err, ErrMalformed, "a length past the datagram")
}

func TestAttrsStopsAtMalformed(t *testing.T) {
	var b Batch
	b.Uint8(1, 1)
	b.buf = append(b.buf, 0xff, 0x00, 2, 0) // a length past the end
	var types []uint16
	for typ := range Attrs(b.buf) {
		types = append(types, typ)
	}
	assert.Equal(t, []uint16{1}, types)
}

// TestRetryInterrupted: a read a concurrent change interrupted runs
// again, up to 10 times in all; any other outcome, or the end of the
// context, ends it.
func TestRetryInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fails     int // interrupted runs before the last
		last      error
		cancel    bool
		wantCalls int
		want      error
	}{
		{name: "succeeds at once", wantCalls: 1},
		{name: "interrupted twice", fails: 2, wantCalls: 3},
		{name: "always interrupted", fails: 100, wantCalls: 10, want: ErrDumpInterrupted},
		{name: "another error", last: unix.EPERM, wantCalls: 1, want: unix.EPERM},
		{name: "context ended", fails: 100, cancel: true, wantCalls: 1, want: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			calls := 0
			err := RetryInterrupted(ctx, func() error {
				if calls++; calls <= tc.fails {
					return fmt.Errorf("dump: %w", ErrDumpInterrupted)
				}
				return tc.last
			})
			assert.Equal(t, tc.wantCalls, calls)
			if tc.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.want)
			}
		})
	}
}
