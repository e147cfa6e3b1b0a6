//go:build linux

package nl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"sync"
	"syscall"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nlsock"
)

// Errors. A message's own failure is an *Error; these are the socket's.
var (
	// ErrLost: the kernel dropped answers that did not fit the socket's
	// receive buffer; the outcome of the chunk's messages is unknown.
	ErrLost = errors.New("netlink answers lost (receive buffer overrun)")
	// ErrDumpInterrupted: a concurrent change interrupted a dump; try
	// again.
	ErrDumpInterrupted = errors.New("netlink dump interrupted by a concurrent change")
	// ErrUnknown marks the messages whose outcome Send does not know when
	// it stops part way: those not sent, and those of a chunk whose
	// answer did not come.
	ErrUnknown = errors.New("outcome unknown: the batch stopped before its answer")
	// ErrClosed: the Conn was closed.
	ErrClosed = errors.New("netlink connection closed")
)

// Error is the kernel's refusal of one message.
type Error struct {
	Errno syscall.Errno
	// Text is the kernel's extended acknowledgement, when it gave one.
	Text string
}

func (e *Error) Error() string {
	if e.Text != "" {
		return e.Errno.Error() + ": " + e.Text
	}
	return e.Errno.Error()
}

// Unwrap returns the errno, so that errors.Is(err, unix.EEXIST) works.
func (e *Error) Unwrap() error { return e.Errno }

// Options configure a Conn.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to,
	// such as a github.com/vishvananda/netns.NsHandle; zero or negative
	// means the caller's. The socket stays bound to it: the descriptor
	// may be closed once Open returns.
	NetNS int
	// ChunkBytes bounds the messages of one sendmsg; zero means
	// DefaultChunkBytes. A message longer than the bound goes alone.
	ChunkBytes int
	// ReceiveBuffer is the socket's receive buffer in bytes; zero means
	// 8 MiB.
	ReceiveBuffer int
}

// DefaultChunkBytes bounds a chunk: about a thousand IPVS requests, whose
// error answers, should every one fail, fit the default receive buffer.
const DefaultChunkBytes = 128 << 10

// Conn is a netlink socket of one protocol in one network namespace. Its
// methods are safe for concurrent use; they run one at a time.
type Conn struct {
	mu     sync.Mutex
	s      *socket.Conn
	seq    uint32
	rbuf   []byte
	sndbuf int
	chunk  int
	closed bool
	stats  Stats
}

// Stats count what a Conn sent.
type Stats struct {
	// Datagrams counts the sendmsg calls, Messages the requests in them.
	Datagrams, Messages int
}

// Stats returns what the Conn sent so far.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Open opens a netlink socket of protocol proto (unix.NETLINK_ROUTE,
// unix.NETLINK_GENERIC, ...).
func Open(proto int, o Options) (*Conn, error) {
	s, err := nlsock.Open(proto, "netlink", o.NetNS, o.ReceiveBuffer)
	if err != nil {
		return nil, err
	}
	// A dump of one link's addresses gets only them (rtnetlink's strict
	// checks, Linux 4.20); older kernels send all, which Addresses
	// filters.
	_ = s.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	c := &Conn{s: s, seq: 1, rbuf: make([]byte, 64<<10), chunk: o.ChunkBytes}
	if c.chunk <= 0 {
		c.chunk = DefaultChunkBytes
	}
	return c, nil
}

// SyscallConn returns the socket's raw connection, for what a socket of
// the namespace serves beside netlink (an interface name by ioctl).
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.s.SyscallConn() }

// Close closes the socket.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.s.Close()
}

// nextSeq reserves n sequence numbers and returns the first. Zero is
// never handed out, so that no answer of the kernel's own matches.
func (c *Conn) nextSeq(n int) uint32 {
	s := c.seq
	c.seq += uint32(n)
	if c.seq < s || s == 0 { // wrapped
		s, c.seq = 1, uint32(n)+1
	}
	return s
}

// Send writes the batch's messages, a chunk per sendmsg, and returns the
// error of each message (nil for success, an *Error for the kernel's
// refusal) in the batch's order. A non-nil error means that Send stopped
// part way (the context ended, a send or receive failed): the messages
// whose outcome it does not know are marked with ErrUnknown. The batch
// may be sent again.
func (c *Conn) Send(ctx context.Context, b *Batch) ([]error, error) {
	b.close()
	errs := make([]error, b.Len())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fill(errs, 0, ErrUnknown), ErrClosed
	}
	for lo := 0; lo < b.Len(); {
		hi := c.chunkEnd(b, lo)
		if err := ctx.Err(); err != nil {
			return fill(errs, lo, ErrUnknown), err
		}
		if err := c.sendChunk(ctx, b, lo, hi, errs); err != nil {
			return fill(errs, lo, ErrUnknown), err
		}
		lo = hi
	}
	return errs, nil
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

// chunkEnd returns the end of the chunk that starts at message lo.
func (c *Conn) chunkEnd(b *Batch, lo int) int {
	size := 0
	for i := lo; i < b.Len(); i++ {
		size += len(b.message(i))
		if size > c.chunk && i > lo {
			return i
		}
	}
	return b.Len()
}

// sendChunk sends messages lo to hi-1 in one datagram, the last asking
// for an acknowledgement, and records the errors the kernel answers.
func (c *Conn) sendChunk(ctx context.Context, b *Batch, lo, hi int, errs []error) error {
	first := c.nextSeq(hi - lo)
	for i := lo; i < hi; i++ {
		b.setHeader(i, first+uint32(i-lo), i == hi-1)
	}
	data := b.buf[b.starts[lo]:]
	if hi < b.Len() {
		data = b.buf[b.starts[lo]:b.starts[hi]]
	}
	if err := c.send(ctx, data, hi-lo); err != nil {
		return err
	}
	last := first + uint32(hi-lo-1)
	for {
		msgs, err := c.receive(ctx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.typ != unix.NLMSG_ERROR || m.seq < first || m.seq > last {
				continue
			}
			if e := errorOf(m); e != nil {
				errs[lo+int(m.seq-first)] = e
			}
			if m.seq == last {
				return nil
			}
		}
	}
}

// send writes p, n messages, in one datagram, growing the send buffer as
// needed.
func (c *Conn) send(ctx context.Context, p []byte, n int) error {
	if need := len(p) + 64<<10; need > c.sndbuf {
		if err := nlsock.SetBuffer(c.s, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, need); err != nil {
			return err
		}
		c.sndbuf = need
	}
	c.stats.Datagrams++
	c.stats.Messages += n
	if _, err := c.s.Sendmsg(ctx, p, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0); err != nil {
		return fmt.Errorf("netlink send of %d bytes: %w", len(p), err)
	}
	return nil
}

// message is one received netlink message.
type message struct {
	typ, flags uint16
	seq        uint32
	data       []byte // payload after the header
}

// receive reads one datagram and splits it into messages, whose data
// point into c.rbuf until the next receive.
func (c *Conn) receive(ctx context.Context) ([]message, error) {
	n, _, rflags, _, err := c.s.Recvmsg(ctx, c.rbuf, nil, 0)
	if errors.Is(err, unix.ENOBUFS) {
		return nil, ErrLost
	}
	if err != nil {
		return nil, fmt.Errorf("netlink receive: %w", err)
	}
	if rflags&unix.MSG_TRUNC != 0 {
		c.rbuf = make([]byte, 2*len(c.rbuf))
		return nil, errors.New("netlink receive: message truncated")
	}
	return split(c.rbuf[:n])
}

func split(b []byte) ([]message, error) {
	var out []message
	for len(b) >= hdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < hdrLen || l > len(b) {
			return nil, errors.New("netlink receive: malformed message")
		}
		out = append(out, message{
			typ:   binary.NativeEndian.Uint16(b[4:]),
			flags: binary.NativeEndian.Uint16(b[6:]),
			seq:   binary.NativeEndian.Uint32(b[8:]),
			data:  b[hdrLen:l],
		})
		b = b[min(len(b), align4(l)):]
	}
	return out, nil
}

func align4(n int) int { return (n + 3) &^ 3 }

// errorOf decodes an NLMSG_ERROR message: nil for an acknowledgement,
// else an *Error with the extended acknowledgement's text.
func errorOf(m message) error {
	if len(m.data) < 4 {
		return &Error{Errno: unix.EPROTO}
	}
	code := int32(binary.NativeEndian.Uint32(m.data))
	if code == 0 {
		return nil
	}
	e := &Error{Errno: syscall.Errno(-code)}
	orig := m.data[4:]
	if m.flags&unix.NLM_F_ACK_TLVS == 0 || len(orig) < hdrLen {
		return e
	}
	off := hdrLen
	if m.flags&unix.NLM_F_CAPPED == 0 {
		off = align4(int(binary.NativeEndian.Uint32(orig)))
	}
	if off > len(orig) {
		return e
	}
	for typ, v := range Attrs(orig[off:]) {
		if typ == unix.NLMSGERR_ATTR_MSG {
			e.Text = cstring(v)
		}
	}
	return e
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Attrs iterates over the attributes in b: type (without the nested and
// byte order flags) and payload. A malformed tail ends the iteration.
func Attrs(b []byte) iter.Seq2[uint16, []byte] {
	return func(yield func(uint16, []byte) bool) {
		for len(b) >= 4 {
			l := int(binary.NativeEndian.Uint16(b))
			if l < 4 || l > len(b) {
				return
			}
			typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if !yield(typ, b[4:l]) {
				return
			}
			b = b[min(len(b), align4(l)):]
		}
	}
}

// Dump sends the batch's one message as a dump request (NLM_F_DUMP) and
// calls f with the type and payload of each message of the answer; f's
// error ends the dump. It fails with ErrDumpInterrupted, once the answer
// is read, if a concurrent change interrupted it.
func (c *Conn) Dump(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return c.request(ctx, b, unix.NLM_F_DUMP, f)
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

// Get sends the batch's one message and calls f with the type and
// payload of each message of the kernel's reply; it returns the kernel's
// refusal as an *Error.
func (c *Conn) Get(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return c.request(ctx, b, unix.NLM_F_ACK, f)
}

func (c *Conn) request(ctx context.Context, b *Batch, flags uint16, f func(uint16, []byte) error) error {
	if b.Len() != 1 {
		return fmt.Errorf("netlink request: %d messages, want 1", b.Len())
	}
	b.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	seq := c.nextSeq(1)
	b.setHeader(0, seq, flags&unix.NLM_F_ACK != 0)
	m := b.message(0)
	binary.NativeEndian.PutUint16(m[6:], binary.NativeEndian.Uint16(m[6:])|flags)
	if err := c.send(ctx, m, 1); err != nil {
		return err
	}
	return c.answer(ctx, seq, f)
}

// answer reads the messages numbered seq until the end of the answer.
func (c *Conn) answer(ctx context.Context, seq uint32, f func(uint16, []byte) error) error {
	var ferr error
	intr := false
	for {
		msgs, err := c.receive(ctx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			intr = intr || m.flags&unix.NLM_F_DUMP_INTR != 0
			switch m.typ {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				// Both carry an errno: a dump's end, the error that cut it
				// short.
				if err := errorOf(m); err != nil && (m.typ == unix.NLMSG_ERROR || len(m.data) >= 4) {
					return err
				}
				if ferr == nil && intr {
					ferr = ErrDumpInterrupted
				}
				return ferr
			default:
				if ferr == nil {
					ferr = f(m.typ, m.data)
				}
			}
		}
	}
}
