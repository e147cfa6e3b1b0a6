//go:build linux

package rtnl

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// body returns the payload of a batch's one message, after its header.
func body(b *nl.Batch) []byte { return b.Wire()[unix.NLMSG_HDRLEN:] }

// newAddrMsg is the body of an RTM_NEWADDR message as the kernel sends
// it: IFA_ADDRESS, IFA_LOCAL for IPv4, and the mark when proto is set.
func newAddrMsg(p netip.Prefix, link int, proto uint8) []byte {
	var b nl.Batch
	b.Message(unix.RTM_NEWADDR, 0, ifaddrmsg(p, link)...)
	b.Addr(unix.IFA_ADDRESS, p.Addr())
	if p.Addr().Is4() {
		b.Addr(unix.IFA_LOCAL, p.Addr())
	}
	if proto != 0 {
		b.Uint8(ifaProto, proto)
	}
	return body(&b)
}

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		p     string
		proto uint8
	}{{"10.96.0.10/32", 0x6b}, {"fd00:96::10/128", 0}, {"192.0.2.1/24", 2}} {
		p := netip.MustParsePrefix(tc.p)
		got, ok := parseAddr(newAddrMsg(p, 7, tc.proto))
		require.True(t, ok, tc.p)
		assert.Equal(t, Addr{Prefix: p, Proto: tc.proto, Link: 7}, got)
	}
	_, ok := parseAddr([]byte{unix.AF_INET, 32})
	assert.False(t, ok, "short message")
}

func TestParseLink(t *testing.T) {
	var b nl.Batch
	b.Message(unix.RTM_NEWLINK, 0, ifinfomsg(4, unix.IFF_UP|unix.IFF_BROADCAST, 0)...)
	b.String(unix.IFLA_IFNAME, "kproxy-us0")
	b.Attr(unix.IFLA_IFALIAS, []byte("kproxy-userspace"))
	b.Nest(unix.IFLA_LINKINFO | unix.NLA_F_NESTED)
	b.String(unix.IFLA_INFO_KIND, "dummy")
	b.End()
	l, ok := parseLink(body(&b))
	require.True(t, ok)
	assert.Equal(t, Link{Index: 4, Name: "kproxy-us0", Kind: "dummy", Flags: unix.IFF_UP | unix.IFF_BROADCAST, Alias: "kproxy-userspace"}, l)
	assert.True(t, l.Up())
	assert.False(t, l.Loopback())
	assert.True(t, l.OwnedBy("kproxy-userspace"))
	assert.False(t, l.OwnedBy("kproxy-ipvs"))
	assert.False(t, Link{}.OwnedBy(""), "no owner owns an unmarked link")
}

// attr is one attribute of a message.
type attr struct {
	Type  uint16
	Value []byte
}

func attrsOf(b []byte) []attr {
	var out []attr
	for typ, v := range nl.Attrs(b) {
		out = append(out, attr{typ, slices.Clone(v)})
	}
	return out
}

// TestAddrRequests: the requests of ChangeAddrs, as the kernel reads
// them: an add asks for creation without replacing an address (EEXIST),
// skips duplicate address detection and carries the mark; a delete names
// the prefix.
func TestAddrRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		proto     uint8
		op        AddrOp
		typ       uint16
		flags     uint16
		attrs     []attr
		withProto uint8
	}{{
		name: "add IPv4, marked", proto: 0x6b, op: AddrOp{Add: true, Prefix: Host(netip.MustParseAddr("10.96.0.1"))},
		typ: unix.RTM_NEWADDR, flags: unix.NLM_F_REQUEST | unix.NLM_F_CREATE | unix.NLM_F_EXCL,
		attrs: []attr{
			{unix.IFA_LOCAL, []byte{10, 96, 0, 1}},
			{unix.IFA_ADDRESS, []byte{10, 96, 0, 1}},
			{unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD)},
			{ifaProto, []byte{0x6b}},
		},
		withProto: 0x6b,
	}, {
		name: "add IPv6, unmarked", op: AddrOp{Add: true, Prefix: Host(netip.MustParseAddr("fd00::1"))},
		typ: unix.RTM_NEWADDR, flags: unix.NLM_F_REQUEST | unix.NLM_F_CREATE | unix.NLM_F_EXCL,
		attrs: []attr{
			{unix.IFA_ADDRESS, netip.MustParseAddr("fd00::1").AsSlice()},
			{unix.IFA_FLAGS, binary.NativeEndian.AppendUint32(nil, unix.IFA_F_NODAD)},
		},
	}, {
		name: "delete a prefix", proto: 0x6b, op: AddrOp{Prefix: netip.MustParsePrefix("10.0.0.0/24")},
		typ: unix.RTM_DELADDR, flags: unix.NLM_F_REQUEST,
		attrs: []attr{{unix.IFA_LOCAL, []byte{10, 0, 0, 0}}, {unix.IFA_ADDRESS, []byte{10, 0, 0, 0}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var b nl.Batch
			addrRequest(&b, 3, tc.proto, tc.op)
			m := b.Wire()
			assert.Equal(t, tc.typ, binary.NativeEndian.Uint16(m[4:6]))
			assert.Equal(t, tc.flags, binary.NativeEndian.Uint16(m[6:8]))
			got, ok := parseAddr(body(&b))
			require.True(t, ok)
			assert.Equal(t, Addr{Prefix: tc.op.Prefix, Proto: tc.withProto, Link: 3}, got)
			assert.Equal(t, tc.attrs, attrsOf(body(&b)[unix.SizeofIfAddrmsg:]))
		})
	}
}

// FuzzParse: the kernel's messages are parsed without a panic, whatever
// they hold.
func FuzzParse(f *testing.F) {
	f.Add(newAddrMsg(netip.MustParsePrefix("fd00::1/128"), 1, 0x6b))
	f.Add(ifinfomsg(1, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseAddr(b)
		parseLink(b)
	})
}
