//go:build linux

package userspace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// rtnl is a route netlink socket in the proxy's namespace, for the
// addresses it holds: batches of adds and deletes, and dumps.
type rtnl struct {
	fd  int
	seq uint32
	buf []byte
}

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 5.18), which
// golang.org/x/sys/unix lacks.
const ifaProto = 11

// openRTNL opens a blocking route netlink socket in the namespace.
func openRTNL(s *sockets) (*rtnl, error) {
	var fd int
	var err error
	open := func() { fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE) }
	if s.ns != nil {
		s.ns.do(open)
	} else {
		open()
	}
	if err != nil {
		return nil, os.NewSyscallError("socket netlink", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind netlink", err)
	}
	// The kernel always answers; the timeout only guards against a bug.
	tv := unix.Timeval{Sec: 10}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	return &rtnl{fd: fd, buf: make([]byte, 1<<16)}, nil
}

func (r *rtnl) close() error { return unix.Close(r.fd) }

// addrOp is one address to add to a link, or delete from it.
type addrOp struct {
	add bool
	a   netip.Addr
}

// heldAddr is an address of a link, with its protocol mark.
type heldAddr struct {
	a     netip.Addr
	proto uint8
}

// header appends a netlink message header to b, and returns b and the
// offset of the header.
func (r *rtnl) header(b []byte, typ, flags uint16) ([]byte, int) {
	r.seq++
	at := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, set at the end
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, r.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return b, at
}

// ifaddrmsg appends an ifaddrmsg for a (all families when a is zero) on
// link.
func ifaddrmsg(b []byte, a netip.Addr, link int) []byte {
	fam, bits := uint8(unix.AF_INET6), uint8(128)
	switch {
	case !a.IsValid():
		fam, bits = unix.AF_UNSPEC, 0
	case a.Is4():
		fam, bits = unix.AF_INET, 32
	}
	b = append(b, fam, bits, 0, unix.RT_SCOPE_UNIVERSE)
	return binary.NativeEndian.AppendUint32(b, uint32(link))
}

func attr(b []byte, typ uint16, data []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func finish(b []byte, at int) []byte {
	binary.NativeEndian.PutUint32(b[at:], uint32(len(b)-at))
	return b
}

// change adds and deletes addresses on link, marking those it adds with
// proto, in batches of messages; it returns each operation's error (nil
// for success), in order.
func (r *rtnl) change(link int, proto uint8, ops []addrOp) ([]error, error) {
	errs := make([]error, len(ops))
	const batch = 256
	for lo := 0; lo < len(ops); lo += batch {
		hi := min(lo+batch, len(ops))
		first := r.seq + 1
		var b []byte
		for _, op := range ops[lo:hi] {
			typ, flags := uint16(unix.RTM_DELADDR), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK)
			if op.add {
				typ, flags = unix.RTM_NEWADDR, flags|unix.NLM_F_CREATE|unix.NLM_F_EXCL
			}
			var at int
			b, at = r.header(b, typ, flags)
			b = ifaddrmsg(b, op.a, link)
			raw := op.a.AsSlice()
			if op.a.Is4() {
				b = attr(b, unix.IFA_LOCAL, raw)
			}
			b = attr(b, unix.IFA_ADDRESS, raw)
			if op.add {
				b = attr(b, unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD))
				b = attr(b, ifaProto, []byte{proto})
			}
			b = finish(b, at)
		}
		if err := unix.Sendto(r.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, os.NewSyscallError("sendto netlink", err)
		}
		if err := r.acks(first, hi-lo, errs[lo:hi]); err != nil {
			return nil, err
		}
	}
	return errs, nil
}

// acks reads the acknowledgements of n requests numbered from first.
func (r *rtnl) acks(first uint32, n int, errs []error) error {
	for got := 0; got < n; {
		msgs, err := r.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || m.Header.Seq >= first+uint32(n) || len(m.Data) < 4 {
				continue
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
				errs[m.Header.Seq-first] = syscall.Errno(-code)
			}
			got++
		}
	}
	return nil
}

func (r *rtnl) receive() ([]syscall.NetlinkMessage, error) {
	n, _, err := unix.Recvfrom(r.fd, r.buf, 0)
	if err != nil {
		return nil, os.NewSyscallError("recvfrom netlink", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(r.buf[:n])
	if err != nil {
		return nil, fmt.Errorf("parse netlink reply: %w", err)
	}
	return msgs, nil
}

// dump returns the addresses of link.
func (r *rtnl) dump(link int) ([]heldAddr, error) {
	b, at := r.header(nil, unix.RTM_GETADDR, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	b = finish(ifaddrmsg(b, netip.Addr{}, link), at)
	var out []heldAddr
	err := r.each(b, func(m syscall.NetlinkMessage) {
		if m.Header.Type == unix.RTM_NEWADDR {
			if h, ok := parseAddr(m.Data, link); ok {
				out = append(out, h)
			}
		}
	})
	return out, err
}

// localIPv6 returns the addresses that the IPv6 local routing table
// routes to the node itself.
func (r *rtnl) localIPv6() (map[netip.Addr]bool, error) {
	b, at := r.header(nil, unix.RTM_GETROUTE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	b = append(b, unix.AF_INET6, 0, 0, 0, unix.RT_TABLE_LOCAL, 0, 0, 0, 0, 0, 0, 0)
	b = finish(b, at)
	out := map[netip.Addr]bool{}
	err := r.each(b, func(m syscall.NetlinkMessage) {
		if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
			return
		}
		if m.Data[4] != unix.RT_TABLE_LOCAL || m.Data[7] != unix.RTN_LOCAL {
			return
		}
		for b := m.Data[unix.SizeofRtMsg:]; len(b) >= 4; {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			if l < 4 || l > len(b) {
				break
			}
			if binary.NativeEndian.Uint16(b[2:4]) == unix.RTA_DST {
				if a, ok := netip.AddrFromSlice(b[4:l]); ok {
					out[a] = true
				}
			}
			b = b[min(len(b), (l+3)&^3):]
		}
	})
	return out, err
}

// each sends a dump request and calls f with every message of the
// answer.
func (r *rtnl) each(req []byte, f func(syscall.NetlinkMessage)) error {
	seq := r.seq
	if err := unix.Sendto(r.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto netlink", err)
	}
	for {
		msgs, err := r.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(m.Data)); code != 0 {
						return os.NewSyscallError("netlink dump", syscall.Errno(-code))
					}
				}
				return nil
			default:
				f(m)
			}
		}
	}
}

// parseAddr reads an address of link out of an RTM_NEWADDR message.
func parseAddr(data []byte, link int) (heldAddr, bool) {
	if len(data) < unix.SizeofIfAddrmsg || int(binary.NativeEndian.Uint32(data[4:8])) != link {
		return heldAddr{}, false
	}
	var h heldAddr
	var local netip.Addr
	for b := data[unix.SizeofIfAddrmsg:]; len(b) >= 4; {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4])
		if l < 4 || l > len(b) {
			break
		}
		v := b[4:l]
		switch typ {
		case unix.IFA_ADDRESS:
			h.a, _ = netip.AddrFromSlice(v)
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(v)
		case ifaProto:
			if len(v) > 0 {
				h.proto = v[0]
			}
		}
		b = b[min(len(b), (l+3)&^3):]
	}
	if local.IsValid() {
		h.a = local
	}
	return h, h.a.IsValid()
}

// isGone reports the error of a delete of an address that is not there.
func isGone(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT)
}
