package nl

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// Socket is a netlink socket of one protocol in one network namespace,
// set up alike for every family: bound, acknowledgements that carry only
// the refused message's header and the kernel's explanation (so that an
// answer's size does not grow with the request's), strict checking of
// dump requests where the kernel offers it, and a receive buffer beyond
// the system limit where the caller may set one. It writes datagrams,
// reads and splits the kernel's, numbers requests and reads a request's
// answer; a Conn adds batches and a lock, and a family that frames
// transactions of its own (nf_tables) uses a Socket under its own lock.
// A Socket is not safe for concurrent use.
type Socket struct {
	s      *socket.Conn
	seq    uint32
	rbuf   []byte
	sndbuf int
}

// OpenSocket opens a netlink socket of protocol proto (unix.NETLINK_ROUTE,
// unix.NETLINK_GENERIC, unix.NETLINK_NETFILTER, ...).
func OpenSocket(proto int, o Options) (*Socket, error) {
	s, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, proto, "netlink", &socket.Config{NetNS: max(o.NetNS, 0)})
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	if err := setup(s, o); err != nil {
		_ = s.Close()
		return nil, err
	}
	rbuf := o.ReadBuffer
	if rbuf <= 0 {
		rbuf = 64 << 10
	}
	return &Socket{s: s, seq: 1, rbuf: make([]byte, rbuf)}, nil
}

func setup(s *socket.Conn, o Options) error {
	if err := s.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: o.Groups}); err != nil {
		return fmt.Errorf("bind netlink socket: %w", err)
	}
	for _, opt := range []int{unix.NETLINK_CAP_ACK, unix.NETLINK_EXT_ACK} {
		if err := s.SetsockoptInt(unix.SOL_NETLINK, opt, 1); err != nil {
			return fmt.Errorf("set netlink socket option %d: %w", opt, err)
		}
	}
	// A dump of one link's addresses gets only them (rtnetlink's strict
	// checks, Linux 4.20); older kernels send all, which the caller
	// filters.
	_ = s.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	rcvbuf := o.ReceiveBuffer
	if rcvbuf <= 0 {
		rcvbuf = DefaultReceiveBuffer
	}
	return setBuffer(s, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rcvbuf)
}

// setBuffer sets a socket buffer (force and plain: SO_RCVBUFFORCE and
// SO_RCVBUF, or the SNDBUF pair) to size bytes: beyond the system limit
// when allowed (CAP_NET_ADMIN), else as far as the limit goes.
func setBuffer(s *socket.Conn, force, plain, size int) error {
	if err := s.SetsockoptInt(unix.SOL_SOCKET, force, size); err == nil {
		return nil
	}
	if err := s.SetsockoptInt(unix.SOL_SOCKET, plain, size); err != nil {
		return fmt.Errorf("set socket buffer to %d bytes: %w", size, err)
	}
	return nil
}

// Close closes the socket.
func (s *Socket) Close() error { return s.s.Close() }

// SyscallConn returns the socket's raw connection, for what a socket of
// the namespace serves beside netlink (an interface name by ioctl).
func (s *Socket) SyscallConn() (syscall.RawConn, error) { return s.s.SyscallConn() }

// NextSeq reserves n sequence numbers and returns the first. Zero is
// never handed out, so that no message the kernel sends of its own
// accord (a notification) is taken for an answer.
func (s *Socket) NextSeq(n int) uint32 {
	first := s.seq
	s.seq += uint32(n)
	if s.seq < first || first == 0 { // wrapped
		first, s.seq = 1, uint32(n)+1
	}
	return first
}

// Write writes the buffers to the kernel as one datagram, growing the
// send buffer as needed: the kernel handles the messages of a datagram
// in order, and aborts an nf_tables batch whose end does not come in the
// datagram of its beginning. A sendmsg takes up to 1024 buffers.
func (s *Socket) Write(ctx context.Context, bufs ...[]byte) error {
	n := 0
	for _, p := range bufs {
		n += len(p)
	}
	if need := n + 64<<10; need > s.sndbuf {
		if err := setBuffer(s.s, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, need); err != nil {
			return err
		}
		s.sndbuf = need
	}
	to := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	var err error
	if len(bufs) == 1 {
		_, err = s.s.Sendmsg(ctx, bufs[0], nil, to, 0)
	} else {
		_, err = s.s.SendmsgBuffers(ctx, bufs, nil, to, 0)
	}
	if err != nil {
		return fmt.Errorf("netlink send of %d bytes: %w", n, err)
	}
	return nil
}

// Read reads one datagram, waiting until one comes or ctx ends, and
// splits it into messages, whose data point into the Socket's buffer
// until the next Read. Answers the kernel dropped for want of room in
// the receive buffer fail it with ErrLost.
func (s *Socket) Read(ctx context.Context) ([]Message, error) {
	n, _, rflags, _, err := s.s.Recvmsg(ctx, s.rbuf, nil, 0)
	if errors.Is(err, unix.ENOBUFS) {
		return nil, ErrLost
	}
	if err != nil {
		return nil, fmt.Errorf("netlink receive: %w", err)
	}
	if rflags&unix.MSG_TRUNC != 0 {
		s.rbuf = make([]byte, 2*len(s.rbuf))
		return nil, errors.New("netlink receive: message truncated")
	}
	return Split(s.rbuf[:n])
}

// Answer reads the answer to the request numbered seq to its end, and
// calls f with each message of a reply or a dump (f's first error stops
// the calls, not the reading, and is returned). The answer ends with an
// acknowledgement (nil), a refusal (an *Error), or a dump's NLMSG_DONE,
// whose errno, when it carries one, tells a dump the kernel cut short
// (an *Error too). A dump the kernel marked as interrupted by a
// concurrent change (NLM_F_DUMP_INTR) fails with ErrDumpInterrupted once
// it is read to its end. Messages of other numbers are passed over.
func (s *Socket) Answer(ctx context.Context, seq uint32, f func(Message) error) error {
	a := answer{seq: seq, f: f}
	for {
		msgs, err := s.Read(ctx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if done, err := a.take(m); done {
				return err
			}
		}
	}
}
