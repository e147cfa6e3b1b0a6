//go:build linux

package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 5.18), which
// golang.org/x/sys/unix lacks.
const ifaProto = 11

// Addr is an address of a link, with its prefix length and its protocol
// mark (0 for none, and on kernels before 5.18).
type Addr struct {
	Prefix netip.Prefix
	Proto  uint8
	// Link is the index of the address's link.
	Link int
}

// AddrOp is one address to add to a link, or to delete from it, with its
// prefix length (the kernel deletes an address of that length only).
type AddrOp struct {
	Add    bool
	Prefix netip.Prefix
}

// Host returns the prefix of a alone (/32, /128): a host address.
func Host(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// ifaddrmsg returns a struct ifaddrmsg for p (all families when p is not
// valid) on link: p's family and length, universe scope.
func ifaddrmsg(p netip.Prefix, link int) []byte {
	fam := uint8(unix.AF_UNSPEC)
	switch {
	case p.Addr().Is4():
		fam = unix.AF_INET
	case p.Addr().Is6():
		fam = unix.AF_INET6
	}
	b := []byte{fam, uint8(max(p.Bits(), 0)), 0, unix.RT_SCOPE_UNIVERSE}
	return binary.NativeEndian.AppendUint32(b, uint32(link))
}

// addrRequest appends op's request to b: RTM_NEWADDR, which fails with
// EEXIST when the link has the address already, skips duplicate address
// detection (IFA_F_NODAD) and carries the mark proto unless it is zero;
// or RTM_DELADDR, which fails with EADDRNOTAVAIL when the link does not
// have it.
func addrRequest(b *nl.Batch, link int, proto uint8, op AddrOp) {
	typ, flags := uint16(unix.RTM_DELADDR), uint16(0)
	if op.Add {
		typ, flags = unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL
	}
	b.Message(typ, flags, ifaddrmsg(op.Prefix, link)...)
	a := op.Prefix.Addr()
	if a.Is4() {
		b.Addr(unix.IFA_LOCAL, a)
	}
	b.Addr(unix.IFA_ADDRESS, a)
	if op.Add {
		b.Uint32(unix.IFA_FLAGS, unix.IFA_F_NODAD)
		if proto != 0 {
			b.Uint8(ifaProto, proto)
		}
	}
}

// ChangeAddrs adds and deletes addresses on link, marking those it adds
// with proto (none when 0), in batches of requests many to a system call
// (see internal/nl), and returns each operation's error in order:
// nil for success, the kernel's refusal (an *nl.Error wrapping the
// errno) else. The kernel handles every request whatever became of the
// others. A non-nil error means that it stopped part way (the context
// ended, a send or receive failed): the operations whose outcome it does
// not know are marked with nl.ErrUnknown. An added address skips
// duplicate address detection: it serves at once.
func (c *Conn) ChangeAddrs(ctx context.Context, link int, proto uint8, ops []AddrOp) ([]error, error) {
	var b nl.Batch
	for _, op := range ops {
		addrRequest(&b, link, proto, op)
	}
	return c.c.Send(ctx, &b)
}

// Addrs returns the addresses of link, of every family, in the kernel's
// order.
func (c *Conn) Addrs(ctx context.Context, link int) ([]Addr, error) {
	return c.addrs(ctx, link)
}

// AllAddrs returns the addresses of every link, of every family, in the
// kernel's order.
func (c *Conn) AllAddrs(ctx context.Context) ([]Addr, error) {
	return c.addrs(ctx, 0)
}

// addrs dumps the addresses of link, or of every link when it is 0.
func (c *Conn) addrs(ctx context.Context, link int) ([]Addr, error) {
	var b nl.Batch
	b.Message(unix.RTM_GETADDR, 0, ifaddrmsg(netip.Prefix{}, link)...)
	var out []Addr
	err := nl.RetryInterrupted(ctx, func() error {
		out = out[:0]
		return c.c.Dump(ctx, &b, func(typ uint16, data []byte) error {
			if typ != unix.RTM_NEWADDR {
				return nil
			}
			// A kernel without strict checks (before 4.20) sends every
			// link's.
			if a, ok := parseAddr(data); ok && (link == 0 || a.Link == link) {
				out = append(out, a)
			}
			return nil
		})
	})
	return out, err
}

// parseAddr reads an address out of an RTM_NEWADDR message: its local
// address where it has one (the peer's is IFA_ADDRESS then), its length,
// its protocol mark and its link.
func parseAddr(data []byte) (Addr, bool) {
	if len(data) < unix.SizeofIfAddrmsg {
		return Addr{}, false
	}
	link := int(binary.NativeEndian.Uint32(data[4:8]))
	bits := int(data[1])
	var address, local netip.Addr
	var proto uint8
	for typ, v := range nl.Attrs(data[unix.SizeofIfAddrmsg:]) {
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
	}
	if local.IsValid() {
		address = local
	}
	if !address.IsValid() || bits > address.BitLen() {
		return Addr{}, false
	}
	return Addr{Prefix: netip.PrefixFrom(address, bits), Proto: proto, Link: link}, true
}

// IsGone reports the error of a delete of an address that is not there.
func IsGone(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT)
}

// LocalIPv6 returns the addresses that the IPv6 local routing table
// routes to the node itself.
func (c *Conn) LocalIPv6(ctx context.Context) (map[netip.Addr]bool, error) {
	var b nl.Batch
	b.Message(unix.RTM_GETROUTE, 0, rtmsg(unix.AF_INET6, 0, unix.RT_TABLE_LOCAL)...)
	out := map[netip.Addr]bool{}
	err := nl.RetryInterrupted(ctx, func() error {
		clear(out)
		return c.c.Dump(ctx, &b, func(typ uint16, data []byte) error {
			if typ != unix.RTM_NEWROUTE || len(data) < unix.SizeofRtMsg {
				return nil
			}
			if data[4] != unix.RT_TABLE_LOCAL || data[7] != unix.RTN_LOCAL {
				return nil
			}
			for at, v := range nl.Attrs(data[unix.SizeofRtMsg:]) {
				if a, ok := netip.AddrFromSlice(v); ok && at == unix.RTA_DST {
					out[a] = true
				}
			}
			return nil
		})
	})
	return out, err
}

// WaitLocal waits, at most timeout, for the IPv6 addresses among addrs to
// be routed to the node: the kernel routes a new IPv6 address only once
// it has left its tentative state, a moment after the add returns (even
// without duplicate address detection), and a flow that came meanwhile
// would be routed elsewhere.
func (c *Conn) WaitLocal(ctx context.Context, addrs []netip.Addr, timeout time.Duration) error {
	var want []netip.Addr
	for _, a := range addrs {
		if a.Is6() {
			want = append(want, a)
		}
	}
	deadline := time.Now().Add(timeout)
	for len(want) > 0 {
		local, err := c.LocalIPv6(ctx)
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
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
