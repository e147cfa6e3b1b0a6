//go:build linux

package nl

import (
	"context"
	"fmt"
	"sync"
	"syscall"
)

// Conn is a netlink socket of one protocol in one network namespace that
// sends batches of requests and reads dumps and replies. Its methods are
// safe for concurrent use; they run one at a time.
type Conn struct {
	mu     sync.Mutex
	s      *Socket
	chunk  int
	closed bool
	stats  Stats
}

// Stats returns what the Conn sent so far.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Open opens a Conn of protocol proto (unix.NETLINK_ROUTE,
// unix.NETLINK_GENERIC, ...).
func Open(proto int, o Options) (*Conn, error) {
	s, err := OpenSocket(proto, o)
	if err != nil {
		return nil, err
	}
	c := &Conn{s: s, chunk: o.ChunkBytes}
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
	first := c.s.NextSeq(hi - lo)
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
		msgs, err := c.s.Read(ctx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Type != TypeError || m.Seq < first || m.Seq > last {
				continue
			}
			if e := ParseAck(m); e != nil {
				errs[lo+int(m.Seq-first)] = e
			}
			if m.Seq == last {
				return nil
			}
		}
	}
}

// send writes p, n messages, in one datagram.
func (c *Conn) send(ctx context.Context, p []byte, n int) error {
	c.stats.Datagrams++
	c.stats.Messages += n
	return c.s.Write(ctx, p)
}

// Dump sends the batch's one message as a dump request (NLM_F_DUMP) and
// calls f with the type and payload of each message of the answer; f's
// error ends the dump. It fails with ErrDumpInterrupted, once the answer
// is read, if a concurrent change interrupted it, and with the kernel's
// *Error if it cut the dump short.
func (c *Conn) Dump(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return c.request(ctx, b, Dump, f)
}

// Get sends the batch's one message and calls f with the type and
// payload of each message of the kernel's reply; it returns the kernel's
// refusal as an *Error.
func (c *Conn) Get(ctx context.Context, b *Batch, f func(typ uint16, data []byte) error) error {
	return c.request(ctx, b, Ack, f)
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
	seq := c.s.NextSeq(1)
	b.setHeader(0, seq, flags&Ack != 0)
	m := b.message(0)
	PutFlags(m, FlagsOf(m)|flags)
	if err := c.send(ctx, m, 1); err != nil {
		return err
	}
	return c.s.Answer(ctx, seq, func(m Message) error {
		if f == nil {
			return nil
		}
		return f(m.Type, m.Data)
	})
}
