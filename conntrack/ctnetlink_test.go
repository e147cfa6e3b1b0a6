//go:build linux

package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// encodeTuple writes a CTA_TUPLE_* payload as the kernel lays it out.
func encodeTuple(t *testing.T, proto uint8, src, dst netip.AddrPort) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Nested(unix.NLA_F_NESTED|ctaTupleIP, func(nae *netlink.AttributeEncoder) error {
		s, d := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
		if src.Addr().Is6() {
			s, d = ctaIPv6Src, ctaIPv6Dst
		}
		nae.Bytes(s, src.Addr().AsSlice())
		nae.Bytes(d, dst.Addr().AsSlice())
		return nil
	})
	ae.Nested(unix.NLA_F_NESTED|ctaTupleProto, func(nae *netlink.AttributeEncoder) error {
		nae.Uint8(ctaProtoNum, proto)
		nae.Uint16(ctaProtoSrcPort, src.Port())
		nae.Uint16(ctaProtoDstPort, dst.Port())
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseEntry(t *testing.T) {
	for _, c := range []struct {
		fam      uint8
		proto    uint8
		src, dst netip.AddrPort
		ep       netip.AddrPort
		zone     bool
	}{
		{unix.AF_INET, unix.IPPROTO_SCTP, netip.MustParseAddrPort("198.51.100.2:40000"), netip.MustParseAddrPort("10.96.0.20:90"), netip.MustParseAddrPort("10.244.1.2:9000"), false},
		{unix.AF_INET6, unix.IPPROTO_UDP, netip.MustParseAddrPort("[fd00:c::2]:40000"), netip.MustParseAddrPort("[fd00:96::10]:53"), netip.MustParseAddrPort("[fd00:244:1::2]:5353"), true},
		{unix.AF_INET, unix.IPPROTO_TCP, netip.MustParseAddrPort("198.51.100.2:1"), netip.MustParseAddrPort("198.51.100.1:30080"), netip.MustParseAddrPort("10.244.2.2:80"), true},
	} {
		orig := encodeTuple(t, c.proto, c.src, c.dst)
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		ae.Bytes(unix.NLA_F_NESTED|ctaTupleOrig, orig)
		ae.Bytes(unix.NLA_F_NESTED|ctaTupleReply, encodeTuple(t, c.proto, c.ep, c.src))
		ae.Uint32(3, 0x18e)                                                        // CTA_STATUS, ignored
		ae.Nested(unix.NLA_F_NESTED|4, func(nae *netlink.AttributeEncoder) error { // CTA_PROTOINFO, ignored
			nae.Nested(unix.NLA_F_NESTED|1, func(n2 *netlink.AttributeEncoder) error { n2.Uint8(1, 3); return nil })
			return nil
		})
		ae.Uint32(ctaTimeout, 117)
		ae.Uint32(ctaMark, 0x4000)
		ae.Uint32(ctaID, 0xdeadbeef)
		if c.zone {
			ae.Uint16(ctaZone, 7)
		}
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		e, err := parseEntry(c.fam, b)
		if err != nil {
			t.Fatal(err)
		}
		wantFam := servicelb.IPv4
		if c.fam == unix.AF_INET6 {
			wantFam = servicelb.IPv6
		}
		want := Flow{Family: wantFam, Protocol: c.proto, Orig: Tuple{c.src, c.dst}, Reply: Tuple{c.ep, c.src},
			Mark: 0x4000, Timeout: 117 * time.Second}
		if c.zone {
			want.Zone = 7
		}
		if e.flow != want {
			t.Errorf("parsed %s\nwant   %s", e.flow, want)
		}
		if string(e.orig) != string(orig) || !e.hasID || e.id != 0xdeadbeef || e.hasZone != c.zone {
			t.Errorf("delete key: orig %x (want %x), id %v %#x, zone %v", e.orig, orig, e.hasID, e.id, e.hasZone)
		}
	}
	if _, err := parseEntry(unix.AF_INET, []byte{8, 0, ctaMark, 0, 0, 0, 0, 1}); err == nil {
		t.Error("a flow without original tuple was accepted")
	}
	if _, err := parseEntry(unix.AF_INET, []byte{9, 0, 1}); err == nil {
		t.Error("a truncated message was accepted")
	}
}

func TestFlowString(t *testing.T) {
	f := mkFlow(udpNo, cli6, netip.AddrPortFrom(vip6, 53), netip.AddrPortFrom(ep61, 5353))
	want := "udp src=[fd00:c::2]:40000 dst=[fd00:96::10]:53 reply src=[fd00:244:1::2]:5353 dst=[fd00:c::2]:40000 mark=0x0 zone=0 timeout=30s"
	if f.String() != want {
		t.Errorf("got  %s\nwant %s", f, want)
	}
}
