//go:build linux

package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
)

// ErrDumpInterrupted: the kernel's list changed while it was being read
// (NLM_F_DUMP_INTR) and a few more tries did not read it whole.
var ErrDumpInterrupted = errors.New("netlink dump interrupted by concurrent changes")

// Conn is a route netlink socket in one network namespace.
type Conn struct {
	fd  int
	seq uint32
	buf []byte
}

// Open opens a route netlink socket in ns; zero or netns.None() means the
// caller's namespace. Another namespace needs CAP_SYS_ADMIN to enter.
func Open(ns netns.NsHandle) (*Conn, error) {
	var fd int
	open := func() (err error) {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		return os.NewSyscallError("socket netlink", err)
	}
	if !ns.IsOpen() {
		ns = 0 // the caller's
	}
	if err := nsutil.Do(ns, open); err != nil {
		return nil, err
	}
	return fromFD(fd)
}

func fromFD(fd int) (*Conn, error) {
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind netlink", err)
	}
	// The kernel always answers; the timeout only guards against a bug.
	tv := unix.Timeval{Sec: 10}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	return &Conn{fd: fd, buf: make([]byte, 1<<16)}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return unix.Close(c.fd) }

// FD returns the socket's descriptor, for ioctls that want a socket of
// the namespace (an interface's name by index). It stays the Conn's.
func (c *Conn) FD() int { return c.fd }

// header appends a netlink message header to b, and returns b and the
// offset of the header.
func (c *Conn) header(b []byte, typ, flags uint16) ([]byte, int) {
	c.seq++
	at := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, set by finish
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, c.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return b, at
}

// finish sets the length of the message that starts at at.
func finish(b []byte, at int) []byte {
	binary.NativeEndian.PutUint32(b[at:], uint32(len(b)-at))
	return b
}

// attr appends an attribute, padded to four bytes.
func attr(b []byte, typ uint16, data []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// attrs calls f with the type and value of each attribute in b.
func attrs(b []byte, f func(typ uint16, v []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		f(binary.NativeEndian.Uint16(b[2:4])&^unix.NLA_F_NESTED, b[4:l])
		b = b[min(len(b), (l+3)&^3):]
	}
}

func (c *Conn) send(b []byte) error {
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto netlink", err)
	}
	return nil
}

func (c *Conn) receive() ([]syscall.NetlinkMessage, error) {
	n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
	if err != nil {
		return nil, os.NewSyscallError("recvfrom netlink", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(c.buf[:n])
	if err != nil {
		return nil, fmt.Errorf("parse netlink reply: %w", err)
	}
	return msgs, nil
}

// errorCode returns the error an NLMSG_ERROR message carries, nil for an
// acknowledgement.
func errorCode(m syscall.NetlinkMessage) error {
	if len(m.Data) < 4 {
		return nil
	}
	if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
		return syscall.Errno(-code)
	}
	return nil
}

// request sends one message that asks for an acknowledgement, calls f
// with each other message of its answer, and returns the kernel's error.
func (c *Conn) request(b []byte, f func(syscall.NetlinkMessage)) error {
	seq := c.seq
	if err := c.send(b); err != nil {
		return err
	}
	for {
		msgs, err := c.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			switch {
			case m.Header.Seq != seq:
			case m.Header.Type == unix.NLMSG_ERROR:
				return errorCode(m)
			case f != nil:
				f(m)
			}
		}
	}
}

// dump sends a dump request and calls f with every message of the
// answer; ErrDumpInterrupted when the kernel says the list changed while
// it was read.
func (c *Conn) dump(req []byte, f func(syscall.NetlinkMessage)) error {
	seq := c.seq
	if err := c.send(req); err != nil {
		return err
	}
	intr := false
	for {
		msgs, err := c.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
				intr = true
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				if intr {
					return ErrDumpInterrupted
				}
				return nil
			case unix.NLMSG_ERROR:
				if err := errorCode(m); err != nil {
					return os.NewSyscallError("netlink dump", err)
				}
				return nil
			default:
				f(m)
			}
		}
	}
}

// retried runs a dump again while the kernel reports it interrupted, a
// few times.
func retried(f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if !errors.Is(err, ErrDumpInterrupted) || i == 9 {
			return err
		}
	}
}
