//go:build linux

package rtnl

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// newAddrMsg is the body of an RTM_NEWADDR message as the kernel sends
// it: IFA_ADDRESS, IFA_LOCAL for IPv4, and the mark when proto is set.
func newAddrMsg(p netip.Prefix, link int, proto uint8) []byte {
	b := ifaddrmsg(nil, p.Addr(), p.Bits(), link)
	raw := p.Addr().AsSlice()
	b = attr(b, unix.IFA_ADDRESS, raw)
	if p.Addr().Is4() {
		b = attr(b, unix.IFA_LOCAL, raw)
	}
	if proto != 0 {
		b = attr(b, ifaProto, []byte{proto})
	}
	return b
}

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		p     string
		proto uint8
	}{{"10.96.0.10/32", 0x6b}, {"fd00:96::10/128", 0}, {"192.0.2.1/24", 2}} {
		p := netip.MustParsePrefix(tc.p)
		got, ok := parseAddr(newAddrMsg(p, 7, tc.proto), 7)
		require.True(t, ok, tc.p)
		assert.Equal(t, Addr{Prefix: p, Proto: tc.proto}, got)
		_, ok = parseAddr(newAddrMsg(p, 7, tc.proto), 8)
		assert.False(t, ok, "%s: another link's address", tc.p)
	}
	_, ok := parseAddr([]byte{unix.AF_INET, 32}, 0)
	assert.False(t, ok, "short message")
}

func TestParseLink(t *testing.T) {
	b := ifinfomsg(nil, 4, unix.IFF_UP|unix.IFF_BROADCAST, 0)
	b = attr(b, unix.IFLA_IFNAME, cstring("kproxy-us0"))
	b = attr(b, unix.IFLA_IFALIAS, []byte("kproxy-userspace"))
	b = attr(b, unix.IFLA_LINKINFO|unix.NLA_F_NESTED, attr(nil, unix.IFLA_INFO_KIND, cstring("dummy")))
	l, ok := parseLink(b)
	require.True(t, ok)
	assert.Equal(t, Link{Index: 4, Name: "kproxy-us0", Kind: "dummy", Flags: unix.IFF_UP | unix.IFF_BROADCAST, Alias: "kproxy-userspace"}, l)
	assert.True(t, l.Up())
	assert.False(t, l.Loopback())
	assert.True(t, l.OwnedBy("kproxy-userspace"))
	assert.False(t, l.OwnedBy("kproxy-ipvs"))
	assert.False(t, Link{}.OwnedBy(""), "no owner owns an unmarked link")
}

// TestChangeAddrsMessages: the messages of a batch, as the kernel reads
// them: an add asks for creation without replacing an address (EEXIST),
// skips duplicate address detection and carries the mark; a delete names
// the prefix.
func TestChangeAddrsMessages(t *testing.T) {
	c := &Conn{}
	add := c.addrMsg(nil, 3, 0x6b, AddrOp{Add: true, Prefix: Host(netip.MustParseAddr("10.96.0.1"))})
	del := c.addrMsg(nil, 3, 0, AddrOp{Prefix: netip.MustParsePrefix("10.0.0.0/24")})
	hdr := func(b []byte) (typ, flags uint16, seq uint32) {
		return binary.NativeEndian.Uint16(b[4:6]), binary.NativeEndian.Uint16(b[6:8]), binary.NativeEndian.Uint32(b[8:12])
	}
	typ, flags, seq := hdr(add)
	assert.Equal(t, uint16(unix.RTM_NEWADDR), typ)
	assert.Equal(t, uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL), flags)
	assert.Equal(t, uint32(1), seq)
	got, ok := parseAddr(add[unix.NLMSG_HDRLEN:], 3)
	require.True(t, ok)
	assert.Equal(t, Addr{Prefix: netip.MustParsePrefix("10.96.0.1/32"), Proto: 0x6b}, got)
	var nodad bool
	attrs(add[unix.NLMSG_HDRLEN+unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) {
		nodad = nodad || typ == unix.IFA_FLAGS && binary.NativeEndian.Uint32(v)&unix.IFA_F_NODAD != 0
	})
	assert.True(t, nodad, "IFA_F_NODAD")

	typ, flags, seq = hdr(del)
	assert.Equal(t, uint16(unix.RTM_DELADDR), typ)
	assert.Equal(t, uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK), flags)
	assert.Equal(t, uint32(2), seq)
	got, ok = parseAddr(del[unix.NLMSG_HDRLEN:], 3)
	require.True(t, ok)
	assert.Equal(t, Addr{Prefix: netip.MustParsePrefix("10.0.0.0/24")}, got)
}

// FuzzParse: the kernel's messages are parsed without a panic, whatever
// they hold.
func FuzzParse(f *testing.F) {
	f.Add(newAddrMsg(netip.MustParsePrefix("fd00::1/128"), 1, 0x6b))
	f.Add(ifinfomsg(nil, 1, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseAddr(b, 1)
		parseLink(b)
	})
}
