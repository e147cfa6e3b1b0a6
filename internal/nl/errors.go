package nl

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"
)

// Errors. A request's own refusal is an *Error; these are the socket's.
var (
	// ErrLost: the kernel dropped answers that did not fit the socket's
	// receive buffer; the outcome of the requests they answered is
	// unknown.
	ErrLost = errors.New("netlink answers lost (receive buffer overrun)")
	// ErrDumpInterrupted: a concurrent change interrupted a dump, whose
	// messages are complete but may disagree with each other; try again.
	ErrDumpInterrupted = errors.New("netlink dump interrupted by a concurrent change")
	// ErrUnknown marks the messages whose outcome Send does not know when
	// it stops part way: those not sent, and those of a chunk whose
	// answer did not come.
	ErrUnknown = errors.New("outcome unknown: the batch stopped before its answer")
	// ErrClosed: the Conn was closed.
	ErrClosed = errors.New("netlink connection closed")
)

// Error is the kernel's refusal of one request.
type Error struct {
	Errno syscall.Errno
	// Text is the kernel's explanation (an extended acknowledgement's
	// message), when it gave one.
	Text string
	// Offset is where, from the start of the refused message, the
	// attribute the kernel refused begins (NLMSGERR_ATTR_OFFS), or 0.
	Offset int
}

func (e *Error) Error() string {
	if e.Text != "" {
		return e.Errno.Error() + ": " + e.Text
	}
	return e.Errno.Error()
}

// Unwrap returns the errno, so that errors.Is(err, unix.EEXIST) works.
func (e *Error) Unwrap() error { return e.Errno }

// ParseAck decodes the payload of an NLMSG_ERROR message (or of the
// NLMSG_DONE that ends a dump, which carries an errno too): nil for an
// acknowledgement, else an *Error with the extended acknowledgement's
// text and offset. The sequence number of the message it answers is the
// answer's own.
func ParseAck(m Message) error {
	if len(m.Data) < 4 {
		return &Error{Errno: syscall.EPROTO}
	}
	code := int32(binary.NativeEndian.Uint32(m.Data))
	if code == 0 {
		return nil
	}
	e := &Error{Errno: syscall.Errno(-code)}
	orig := m.Data[4:]
	if m.Flags&AckTLVs == 0 || len(orig) < HeaderLen {
		return e
	}
	// The refused message's header, and its payload unless capped.
	off := HeaderLen
	if m.Flags&Capped == 0 {
		off = Align(LengthOf(orig))
	}
	if off > len(orig) {
		return e
	}
	for typ, v := range Attrs(orig[off:]) {
		switch {
		case typ == ackAttrMsg:
			e.Text = CString(v)
		case typ == ackAttrOffs && len(v) == 4:
			e.Offset = int(binary.NativeEndian.Uint32(v))
		}
	}
	return e
}

// fill marks the messages from i on that have no error with err, and
// returns errs.
func fill(errs []error, i int, err error) []error {
	for ; i < len(errs); i++ {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	return errs
}

// RetryInterrupted runs f, a read made of dumps, again while it fails
// with ErrDumpInterrupted, up to 10 times in all, unless ctx ends; f
// starts its result afresh each time.
func RetryInterrupted(ctx context.Context, f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if !errors.Is(err, ErrDumpInterrupted) || i == 9 {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
