//go:build linux

package userspace

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/kproxy-dev/kproxy/internal/nlbatch"
	"golang.org/x/sys/unix"
)

// rtnl is a route netlink socket in the proxy's namespace, for the
// addresses it holds (batches of adds and deletes, and dumps, through
// internal/nlbatch) and for route lookups.
type rtnl struct {
	c *nlbatch.Conn
}

// openRTNL opens a route netlink socket in the namespace.
func openRTNL(s *sockets) (*rtnl, error) {
	var c *nlbatch.Conn
	var err error
	open := func() { c, err = nlbatch.Open(unix.NETLINK_ROUTE, nlbatch.Options{}) }
	if s.ns != nil {
		s.ns.do(open)
	} else {
		open()
	}
	if err != nil {
		return nil, err
	}
	return &rtnl{c: c}, nil
}

func (r *rtnl) close() error { return r.c.Close() }

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

// change adds and deletes addresses on link, marking those it adds with
// proto, in batches of requests; it returns each operation's error (nil
// for success), in order. The kernel always answers: the context only
// bounds a bug.
func (r *rtnl) change(link int, proto uint8, ops []addrOp) ([]error, error) {
	var b nlbatch.Batch
	for _, op := range ops {
		p := netip.PrefixFrom(op.a, op.a.BitLen())
		if op.add {
			nlbatch.AddAddress(&b, link, p, proto)
		} else {
			nlbatch.DelAddress(&b, link, p)
		}
	}
	return r.c.Send(context.Background(), &b)
}

// dump returns the addresses of link.
func (r *rtnl) dump(link int) ([]heldAddr, error) {
	list, err := r.c.Addresses(context.Background(), link)
	out := make([]heldAddr, len(list))
	for i, a := range list {
		out[i] = heldAddr{a: a.Prefix.Addr(), proto: a.Proto}
	}
	return out, err
}

// localIPv6 returns the addresses that the IPv6 local routing table
// routes to the node itself.
func (r *rtnl) localIPv6() (map[netip.Addr]bool, error) {
	var b nlbatch.Batch
	b.Message(unix.RTM_GETROUTE, 0, unix.AF_INET6, 0, 0, 0, unix.RT_TABLE_LOCAL, 0, 0, 0, 0, 0, 0, 0)
	out := map[netip.Addr]bool{}
	err := r.c.Dump(context.Background(), &b, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWROUTE || len(data) < unix.SizeofRtMsg {
			return nil
		}
		if data[4] != unix.RT_TABLE_LOCAL || data[7] != unix.RTN_LOCAL {
			return nil
		}
		for at, v := range nlbatch.Attrs(data[unix.SizeofRtMsg:]) {
			if at == unix.RTA_DST {
				if a, ok := netip.AddrFromSlice(v); ok {
					out[a] = true
				}
			}
		}
		return nil
	})
	return out, err
}

// routeOIF asks the kernel which interface it routes packets to a
// through.
func (r *rtnl) routeOIF(a netip.Addr) (int, error) {
	fam, bits := byte(unix.AF_INET), byte(32)
	if a.Is6() {
		fam, bits = unix.AF_INET6, 128
	}
	var b nlbatch.Batch
	b.Message(unix.RTM_GETROUTE, 0, fam, bits, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // struct rtmsg, rtm_flags 0
	b.Addr(unix.RTA_DST, a)
	oif := 0
	err := r.c.Get(context.Background(), &b, func(typ uint16, data []byte) error {
		if typ == unix.RTM_NEWROUTE {
			oif = routeAttrOIF(data)
		}
		return nil
	})
	return oif, err
}

// routeAttrOIF reads RTA_OIF out of an RTM_NEWROUTE message, or 0.
func routeAttrOIF(data []byte) int {
	if len(data) < unix.SizeofRtMsg {
		return 0
	}
	for at, v := range nlbatch.Attrs(data[unix.SizeofRtMsg:]) {
		if at == unix.RTA_OIF && len(v) >= 4 {
			return int(binary.NativeEndian.Uint32(v))
		}
	}
	return 0
}

// linkName returns the name of interface index, or "".
func (r *rtnl) linkName(index int) string {
	rc, err := r.c.SyscallConn()
	if err != nil {
		return ""
	}
	name := ""
	_ = rc.Control(func(fd uintptr) { name = ifaceName(int(fd), index) })
	return name
}

// isGone reports the error of a delete of an address that is not there.
func isGone(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT)
}
