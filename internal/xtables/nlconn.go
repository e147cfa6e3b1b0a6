package xtables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NLConn is a Conn over a NETLINK_NETFILTER socket opened in one network
// namespace. It needs CAP_NET_ADMIN there. Safe for concurrent use.
type NLConn struct {
	mu  sync.Mutex
	fd  int
	seq uint32
	// sndbuf is the send buffer size last forced, to grow for big batches.
	sndbuf int
}

// Dial opens an NLConn in network namespace ns; a handle that is not
// valid (zero or negative) means the caller's namespace.
func Dial(ns netns.NsHandle) (*NLConn, error) {
	var fd int
	open := func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	}
	var err error
	if ns > 0 {
		err = inNetNS(ns, open)
	} else {
		err = open()
	}
	if err != nil {
		return nil, fmt.Errorf("open nf_tables netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind nf_tables netlink socket: %w", err)
	}
	// Large dumps and error reports must not overflow the receive buffer.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	return &NLConn{fd: fd}, nil
}

// inNetNS runs f on a thread inside ns. The thread goes back to its
// namespace afterwards or, if it cannot, is never reused.
func inNetNS(ns netns.NsHandle, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			done <- fmt.Errorf("enter network namespace: %w", err)
			runtime.UnlockOSThread()
			return
		}
		err = f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// Close closes the socket.
func (c *NLConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

func (c *NLConn) nextSeq() uint32 {
	c.seq++
	return c.seq
}

// GenID implements Conn.
func (c *NLConn) GenID(ctx context.Context) (uint32, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req := request(msgGetGen, 0, 0, nil)
	seq := c.nextSeq()
	binary.LittleEndian.PutUint32(req[8:], seq)
	msgs, err := c.exchange(ctx, req, seq, false)
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		_, _, payload, err := nfPayload(m)
		if err != nil {
			return 0, err
		}
		attrs, err := parseAttrs(payload)
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if a.typ == attrGenID {
				return attrU32(a), nil
			}
		}
	}
	return 0, fmt.Errorf("%w: no generation in reply", errMalformed)
}

// Dump implements Conn. A dump the kernel interrupts because the ruleset
// changed meanwhile is retried.
func (c *NLConn) Dump(ctx context.Context, req []byte) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req = append([]byte(nil), req...)
	for range 5 {
		seq := c.nextSeq()
		binary.LittleEndian.PutUint32(req[8:], seq)
		msgs, err := c.exchange(ctx, req, seq, true)
		if !errors.Is(err, errDumpInterrupted) {
			return msgs, err
		}
	}
	return nil, errDumpInterrupted
}

var errDumpInterrupted = errors.New("dump interrupted by concurrent changes")

// exchange sends one request and reads its reply: up to NLMSG_DONE for a
// dump, else one message or error.
func (c *NLConn) exchange(ctx context.Context, req []byte, seq uint32, dump bool) ([][]byte, error) {
	if err := c.send(req); err != nil {
		return nil, err
	}
	var out [][]byte
	buf := make([]byte, 1<<20)
	intr := false
	for {
		n, err := c.recv(ctx, buf, true)
		if err != nil {
			return nil, err
		}
		for msg := buf[:n]; len(msg) >= unix.NLMSG_HDRLEN; {
			l := int(binary.LittleEndian.Uint32(msg))
			if l < unix.NLMSG_HDRLEN || l > len(msg) {
				return nil, errMalformed
			}
			m := msg[:l]
			msg = msg[min((l+3)&^3, len(msg)):]
			if binary.LittleEndian.Uint32(m[8:]) != seq {
				continue // a late reply to an earlier request
			}
			intr = intr || binary.LittleEndian.Uint16(m[6:])&unix.NLM_F_DUMP_INTR != 0
			switch binary.LittleEndian.Uint16(m[4:]) {
			case unix.NLMSG_DONE:
				if intr {
					return nil, errDumpInterrupted
				}
				return out, nil
			case unix.NLMSG_ERROR:
				if code := nlErrno(m); code != 0 {
					return nil, code
				}
				if !dump {
					return out, nil
				}
			default:
				out = append(out, append([]byte(nil), m...))
				if !dump {
					return out, nil
				}
			}
		}
	}
}

func nlErrno(m []byte) syscall.Errno {
	if len(m) < 20 {
		return syscall.EINVAL
	}
	return syscall.Errno(-int32(binary.LittleEndian.Uint32(m[16:])))
}

func (c *NLConn) send(b []byte) error {
	if c.fd < 0 {
		return errors.New("netlink socket closed")
	}
	if need := len(b) + 4096; need > c.sndbuf && need > 200<<10 {
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, need); err != nil {
			return fmt.Errorf("raise netlink send buffer to %d bytes: %w", need, err)
		}
		c.sndbuf = need
	}
	for {
		err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if err != unix.EINTR {
			return err
		}
	}
}

// recv reads one datagram, waiting for it when wait is set, until ctx
// ends; without wait it returns EAGAIN when nothing is queued.
func (c *NLConn) recv(ctx context.Context, buf []byte, wait bool) (int, error) {
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil:
			return n, nil
		case err == unix.EINTR:
			continue
		case err != unix.EAGAIN || !wait:
			return 0, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		timeout := 100 * time.Millisecond
		if d, ok := ctx.Deadline(); ok {
			timeout = min(timeout, max(time.Until(d), time.Millisecond))
		}
		if _, err := unix.Poll(fds, int(timeout/time.Millisecond)); err != nil && err != unix.EINTR {
			return 0, err
		}
	}
}

// Batch implements Conn. The kernel handles the batch while it is sent,
// so its answers (errors and echoes) are queued when sendto returns.
func (c *NLConn) Batch(ctx context.Context, body []byte, genID uint32) ([][]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	first := c.seq + 1
	c.seq += 2 + batchLen(body)
	msg := make([]byte, 0, len(body)+64)
	msg = appendBatchMark(msg, unix.NFNL_MSG_BATCH_BEGIN, first, genID)
	msg = append(msg, body...)
	renumber(msg[len(msg)-len(body):], first+1)
	msg = appendBatchMark(msg, unix.NFNL_MSG_BATCH_END, c.seq, 0)
	if err := c.send(msg); err != nil {
		return nil, fmt.Errorf("send batch of %d bytes: %w", len(msg), err)
	}
	var echoes [][]byte
	var firstErr error
	buf := make([]byte, 1<<20)
	for {
		n, err := c.recv(ctx, buf, false)
		if err == unix.EAGAIN {
			return echoes, firstErr
		}
		if err != nil {
			return nil, fmt.Errorf("read batch answers: %w", err)
		}
		for m := buf[:n]; len(m) >= unix.NLMSG_HDRLEN; {
			l := int(binary.LittleEndian.Uint32(m))
			if l < unix.NLMSG_HDRLEN || l > len(m) {
				return nil, errMalformed
			}
			seq := binary.LittleEndian.Uint32(m[8:])
			if seq >= first && seq <= c.seq {
				switch binary.LittleEndian.Uint16(m[4:]) {
				case unix.NLMSG_ERROR:
					if code := nlErrno(m[:l]); code != 0 && firstErr == nil {
						firstErr = batchErr(body, seq-first, code)
					}
				default:
					e := append([]byte(nil), m[:l]...)
					binary.LittleEndian.PutUint32(e[8:], seq-first)
					echoes = append(echoes, e)
				}
			}
			m = m[min((l+3)&^3, len(m)):]
		}
	}
}

func batchErr(body []byte, seq uint32, code syscall.Errno) error {
	if seq == 0 {
		if code == unix.ERESTART {
			return ErrGenChanged
		}
		return fmt.Errorf("batch refused: %w", code)
	}
	return &BatchError{Seq: seq, Op: describe(body, seq), Err: code}
}

// batchLen counts the messages of a batch body.
func batchLen(body []byte) uint32 {
	var n uint32
	for len(body) >= 16 {
		l := int(binary.LittleEndian.Uint32(body))
		if l < 16 || l > len(body) {
			break
		}
		n++
		body = body[min((l+3)&^3, len(body)):]
	}
	return n
}

// renumber gives the messages of b the sequence numbers from first on, in
// place. Echoes and errors are mapped back to the body's own numbers (1,
// 2, ...) when read.
func renumber(b []byte, first uint32) {
	for seq := first; len(b) >= 16; seq++ {
		l := int(binary.LittleEndian.Uint32(b))
		if l < 16 || l > len(b) {
			break
		}
		binary.LittleEndian.PutUint32(b[8:], seq)
		b = b[min((l+3)&^3, len(b)):]
	}
}

func appendBatchMark(b []byte, typ uint16, seq, genID uint32) []byte {
	n := 20
	if genID != 0 {
		n += 8
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint16(b, typ)
	b = binary.LittleEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = append(b, 0, 0, 0, subsysNFTables)
	if genID != 0 {
		b = append(b, 8, 0, 1, 0) // NFNL_BATCH_GENID
		b = binary.BigEndian.AppendUint32(b, genID)
	}
	return b
}
