//go:build linux

package nfnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nlsock"
)

// Options configure a Conn.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to, such
	// as a github.com/vishvananda/netns.NsHandle; zero or negative means
	// the caller's namespace. The socket is created in that namespace and
	// stays bound to it: the descriptor may be closed once Open returns.
	NetNS int
	// ReceiveBuffer is the socket's receive buffer for dumps, in bytes;
	// zero means 8 MiB.
	ReceiveBuffer int
}

// Conn is a netlink socket of the nf_tables subsystem in one network
// namespace. Its methods are safe for concurrent use; they run one at a
// time.
type Conn struct {
	mu      sync.Mutex
	s       *socket.Conn
	seq     uint32
	rbuf    []byte
	sndbuf  int
	closed  bool
	scratch encoder
	refuse  func(owner any) bool // RefuseRules
}

// Open opens a Conn. It needs CAP_NET_ADMIN in the target namespace to
// change or read the ruleset.
func Open(o Options) (*Conn, error) {
	s, err := nlsock.Open(unix.NETLINK_NETFILTER, "nfnl", o.NetNS, o.ReceiveBuffer)
	if err != nil {
		return nil, fmt.Errorf("nfnl: %w", err)
	}
	return &Conn{s: s, seq: 1, rbuf: make([]byte, 1<<20)}, nil
}

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

// nextSeq reserves n sequence numbers and returns the first.
func (c *Conn) nextSeq(n int) uint32 {
	s := c.seq
	c.seq += uint32(n)
	if c.seq < s { // wrapped
		s, c.seq = 1, uint32(n)+1
	}
	return s
}

// message is one received netlink message.
type message struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte // payload after the netlink header
}

// receive reads one datagram and splits it into messages. The messages'
// data point into c.rbuf and are valid until the next receive.
func (c *Conn) receive(ctx context.Context) ([]message, error) {
	n, _, rflags, _, err := c.s.Recvmsg(ctx, c.rbuf, nil, 0)
	if err != nil {
		return nil, fmt.Errorf("nfnl: receive: %w", err)
	}
	if rflags&unix.MSG_TRUNC != 0 {
		c.rbuf = make([]byte, 2*len(c.rbuf))
		return nil, errors.New("nfnl: receive: message truncated")
	}
	return splitMessages(c.rbuf[:n])
}

func splitMessages(b []byte) ([]message, error) {
	var out []message
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return nil, errors.New("nfnl: receive: malformed netlink message")
		}
		out = append(out, message{
			typ:   binary.NativeEndian.Uint16(b[4:]),
			flags: binary.NativeEndian.Uint16(b[6:]),
			seq:   binary.NativeEndian.Uint32(b[8:]),
			data:  b[nlmsgHdrLen:l],
		})
		a := align4(l)
		if a > len(b) {
			a = len(b)
		}
		b = b[a:]
	}
	return out, nil
}

// errorOf decodes an NLMSG_ERROR message: its errno (0 for an ack), the
// sequence number of the message it answers, and the extended ack text.
func errorOf(m message) (syscall.Errno, uint32, string) {
	if len(m.data) < 4+nlmsgHdrLen {
		return syscall.EPROTO, m.seq, ""
	}
	code := int32(binary.NativeEndian.Uint32(m.data))
	seq := binary.NativeEndian.Uint32(m.data[4+8:])
	var text string
	for _, a := range ackAttrs(m) {
		if a.typ == extAckMsg {
			text = a.str()
		}
	}
	return syscall.Errno(-code), seq, text
}

// badAttrOf returns the offset, from the start of the failed message, of
// the attribute the kernel points at in its extended acknowledgement
// (NLMSGERR_ATTR_OFFS), or 0 when it points at none.
func badAttrOf(m message) int {
	for _, a := range ackAttrs(m) {
		if a.typ == extAckOffs && len(a.data) == 4 {
			return int(binary.NativeEndian.Uint32(a.data))
		}
	}
	return 0
}

// ackAttrs returns the extended acknowledgement's attributes of an
// NLMSG_ERROR message, if it has any.
func ackAttrs(m message) []attribute {
	if m.flags&nlmAckTLVs == 0 || len(m.data) < 4+nlmsgHdrLen {
		return nil
	}
	orig := m.data[4:]
	off := nlmsgHdrLen
	if m.flags&nlmCapped == 0 {
		off = align4(int(binary.NativeEndian.Uint32(orig)))
	}
	if off > len(orig) {
		return nil
	}
	as, err := attributes(orig[off:])
	if err != nil {
		return nil
	}
	return as
}

// send writes the buffers to the kernel as one datagram, growing the send
// buffer as needed: a batch must travel in a single message, since the
// kernel aborts one whose end does not come in the datagram of its
// beginning. A sendmsg takes up to 1024 buffers.
func (c *Conn) send(ctx context.Context, bufs ...[]byte) error {
	n := 0
	for _, p := range bufs {
		n += len(p)
	}
	if need := n + 64<<10; need > c.sndbuf {
		if err := nlsock.SetBuffer(c.s, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, need); err != nil {
			return err
		}
		c.sndbuf = need
	}
	to := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	var err error
	if len(bufs) == 1 {
		_, err = c.s.Sendmsg(ctx, bufs[0], nil, to, 0)
	} else {
		_, err = c.s.SendmsgBuffers(ctx, bufs, nil, to, 0)
	}
	if err != nil {
		return fmt.Errorf("nfnl: send %d bytes: %w", n, err)
	}
	return nil
}
