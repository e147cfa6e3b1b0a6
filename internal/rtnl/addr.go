//go:build linux

package rtnl

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 5.18), which
// golang.org/x/sys/unix lacks.
const ifaProto = 11

// Addr is an address of a link, with its prefix length and its protocol
// mark (0 for none).
type Addr struct {
	Prefix netip.Prefix
	Proto  uint8
}

// AddrOp is one address to add to a link, or to delete from it, with its
// prefix length (the kernel deletes an address of that length only).
type AddrOp struct {
	Add    bool
	Prefix netip.Prefix
}

// Host returns the prefix of a alone (/32, /128): a host address.
func Host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// ifaddrmsg appends a struct ifaddrmsg for a (all families when a is
// zero) with prefix length bits on link.
func ifaddrmsg(b []byte, a netip.Addr, bits, link int) []byte {
	fam := uint8(unix.AF_INET6)
	switch {
	case !a.IsValid():
		fam = unix.AF_UNSPEC
	case a.Is4():
		fam = unix.AF_INET
	}
	b = append(b, fam, uint8(bits), 0, unix.RT_SCOPE_UNIVERSE)
	return binary.NativeEndian.AppendUint32(b, uint32(link))
}

// batch is the number of address changes sent in one write.
const batch = 256

// ChangeAddrs adds and deletes addresses on link, marking those it adds
// with proto (none when 0), in batches of messages; it returns each
// operation's error (nil for success), in order, or an error that stopped
// them all. An added address skips duplicate address detection
// (IFA_F_NODAD): it serves at once.
func (c *Conn) ChangeAddrs(link int, proto uint8, ops []AddrOp) ([]error, error) {
	errs := make([]error, len(ops))
	for lo := 0; lo < len(ops); lo += batch {
		hi := min(lo+batch, len(ops))
		first := c.seq + 1
		var b []byte
		for _, op := range ops[lo:hi] {
			b = c.addrMsg(b, link, proto, op)
		}
		if err := c.send(b); err != nil {
			return nil, err
		}
		if err := c.acks(first, hi-lo, errs[lo:hi]); err != nil {
			return nil, err
		}
	}
	return errs, nil
}

func (c *Conn) addrMsg(b []byte, link int, proto uint8, op AddrOp) []byte {
	typ, flags := uint16(unix.RTM_DELADDR), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	if op.Add {
		typ, flags = unix.RTM_NEWADDR, flags|unix.NLM_F_CREATE|unix.NLM_F_EXCL
	}
	var at int
	b, at = c.header(b, typ, flags)
	a := op.Prefix.Addr()
	b = ifaddrmsg(b, a, op.Prefix.Bits(), link)
	raw := a.AsSlice()
	if a.Is4() {
		b = attr(b, unix.IFA_LOCAL, raw)
	}
	b = attr(b, unix.IFA_ADDRESS, raw)
	if op.Add {
		b = attr(b, unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD))
		if proto != 0 {
			b = attr(b, ifaProto, []byte{proto})
		}
	}
	return finish(b, at)
}

// acks reads the acknowledgements of n requests numbered from first.
func (c *Conn) acks(first uint32, n int, errs []error) error {
	for got := 0; got < n; {
		msgs, err := c.receive()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || m.Header.Seq >= first+uint32(n) {
				continue
			}
			errs[m.Header.Seq-first] = errorCode(m)
			got++
		}
	}
	return nil
}

// Addrs returns the addresses of link.
func (c *Conn) Addrs(link int) ([]Addr, error) {
	var out []Addr
	err := retried(func() error {
		out = out[:0]
		b, at := c.header(nil, unix.RTM_GETADDR, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		b = finish(ifaddrmsg(b, netip.Addr{}, 0, link), at)
		return c.dump(b, func(m syscall.NetlinkMessage) {
			if m.Header.Type == unix.RTM_NEWADDR {
				if a, ok := parseAddr(m.Data, link); ok {
					out = append(out, a)
				}
			}
		})
	})
	return out, err
}

// parseAddr reads an address of link out of an RTM_NEWADDR message.
func parseAddr(data []byte, link int) (Addr, bool) {
	if len(data) < unix.SizeofIfAddrmsg || int(binary.NativeEndian.Uint32(data[4:8])) != link {
		return Addr{}, false
	}
	bits := int(data[1])
	var address, local netip.Addr
	var proto uint8
	attrs(data[unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.IFA_ADDRESS:
			address, _ = netip.AddrFromSlice(v)
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(v)
		case ifaProto:
			if len(v) > 0 {
				proto = v[0]
			}
		}
	})
	if local.IsValid() {
		address = local
	}
	if !address.IsValid() || bits > address.BitLen() {
		return Addr{}, false
	}
	return Addr{Prefix: netip.PrefixFrom(address, bits), Proto: proto}, true
}

// IsGone reports the error of a delete of an address that is not there.
func IsGone(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT)
}

// LocalIPv6 returns the addresses that the IPv6 local routing table
// routes to the node itself.
func (c *Conn) LocalIPv6() (map[netip.Addr]bool, error) {
	out := map[netip.Addr]bool{}
	err := retried(func() error {
		clear(out)
		b, at := c.header(nil, unix.RTM_GETROUTE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		b = append(b, unix.AF_INET6, 0, 0, 0, unix.RT_TABLE_LOCAL, 0, 0, 0, 0, 0, 0, 0)
		return c.dump(finish(b, at), func(m syscall.NetlinkMessage) {
			if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
				return
			}
			if m.Data[4] != unix.RT_TABLE_LOCAL || m.Data[7] != unix.RTN_LOCAL {
				return
			}
			attrs(m.Data[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
				if a, ok := netip.AddrFromSlice(v); ok && typ == unix.RTA_DST {
					out[a] = true
				}
			})
		})
	})
	return out, err
}

// WaitLocal waits, at most timeout, for the IPv6 addresses among addrs to
// be routed to the node: the kernel routes a new IPv6 address only once
// it has left its tentative state, a moment after the add returns (even
// without duplicate address detection), and a flow that came meanwhile
// would be routed elsewhere.
func (c *Conn) WaitLocal(addrs []netip.Addr, timeout time.Duration) error {
	var want []netip.Addr
	for _, a := range addrs {
		if a.Is6() {
			want = append(want, a)
		}
	}
	deadline := time.Now().Add(timeout)
	for len(want) > 0 {
		local, err := c.LocalIPv6()
		if err != nil {
			return &OpError{Op: "list local routes", Object: "ipv6", Err: err}
		}
		want = slices.DeleteFunc(want, func(a netip.Addr) bool { return local[a] })
		if len(want) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return &OpError{Op: "wait for the local route", Object: want[0].String(), Err: unix.ETIMEDOUT}
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
