//go:build linux

package nlbatch

import (
	"context"
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 5.18), which
// golang.org/x/sys/unix lacks.
const ifaProto = 11

// Address is an address of a link, with the protocol mark it was added
// with (IFA_PROTO; zero for none, and on kernels before 5.18).
type Address struct {
	Prefix netip.Prefix
	Proto  uint8
}

// AddAddress appends the request that adds p to link (an interface
// index): RTM_NEWADDR, failing with EEXIST when the link has it already,
// without duplicate address detection (IFA_F_NODAD), marked with proto
// unless it is zero.
func AddAddress(b *Batch, link int, p netip.Prefix, proto uint8) {
	b.Message(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ifaddrmsg(p, link)...)
	addrAttrs(b, p.Addr())
	b.Uint32(unix.IFA_FLAGS, unix.IFA_F_NODAD)
	if proto != 0 {
		b.Uint8(ifaProto, proto)
	}
}

// DelAddress appends the request that deletes p from link: RTM_DELADDR,
// failing with EADDRNOTAVAIL when the link does not have it.
func DelAddress(b *Batch, link int, p netip.Prefix) {
	b.Message(unix.RTM_DELADDR, 0, ifaddrmsg(p, link)...)
	addrAttrs(b, p.Addr())
}

func addrAttrs(b *Batch, a netip.Addr) {
	if a.Is4() {
		b.Addr(unix.IFA_LOCAL, a)
	}
	b.Addr(unix.IFA_ADDRESS, a)
}

// ifaddrmsg returns the fixed part of an address request: p's family and
// length (all families when p is not valid), universe scope, the link.
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

// Addresses returns the addresses of link, of every family, in the
// kernel's order.
func (c *Conn) Addresses(ctx context.Context, link int) ([]Address, error) {
	var b Batch
	b.Message(unix.RTM_GETADDR, 0, ifaddrmsg(netip.Prefix{}, link)...)
	var out []Address
	err := c.Dump(ctx, &b, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWADDR {
			return nil
		}
		if a, ok := parseAddr(data, link); ok {
			out = append(out, a)
		}
		return nil
	})
	return out, err
}

// parseAddr reads an address of link out of an RTM_NEWADDR message: its
// local address where it has one (the peer's is IFA_ADDRESS then), its
// length and its protocol mark.
func parseAddr(data []byte, link int) (Address, bool) {
	if len(data) < unix.SizeofIfAddrmsg || int(binary.NativeEndian.Uint32(data[4:8])) != link {
		return Address{}, false
	}
	bits := int(data[1])
	var addr, local netip.Addr
	var proto uint8
	for typ, v := range Attrs(data[unix.SizeofIfAddrmsg:]) {
		switch typ {
		case unix.IFA_ADDRESS:
			addr, _ = netip.AddrFromSlice(v)
		case unix.IFA_LOCAL:
			local, _ = netip.AddrFromSlice(v)
		case ifaProto:
			if len(v) > 0 {
				proto = v[0]
			}
		}
	}
	if local.IsValid() {
		addr = local
	}
	if !addr.IsValid() {
		return Address{}, false
	}
	return Address{Prefix: netip.PrefixFrom(addr, bits), Proto: proto}, true
}
