//go:build linux

package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// FuzzParseEntry feeds arbitrary ctnetlink payloads to the flow parser:
// it fails or succeeds, never panics, and a flow it accepts has both
// tuples of one family, the family asked for.
func FuzzParseEntry(f *testing.F) {
	enc := func(proto uint8, src, dst, ep netip.AddrPort) []byte {
		tuple := func(s, d netip.AddrPort) []byte {
			ae := netlink.NewAttributeEncoder()
			ae.ByteOrder = binary.BigEndian
			ae.Nested(unix.NLA_F_NESTED|ctaTupleIP, func(n *netlink.AttributeEncoder) error {
				a, b := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
				if s.Addr().Is6() {
					a, b = ctaIPv6Src, ctaIPv6Dst
				}
				n.Bytes(a, s.Addr().AsSlice())
				n.Bytes(b, d.Addr().AsSlice())
				return nil
			})
			ae.Nested(unix.NLA_F_NESTED|ctaTupleProto, func(n *netlink.AttributeEncoder) error {
				n.Uint8(ctaProtoNum, proto)
				n.Uint16(ctaProtoSrcPort, s.Port())
				n.Uint16(ctaProtoDstPort, d.Port())
				return nil
			})
			b, _ := ae.Encode()
			return b
		}
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		ae.Bytes(unix.NLA_F_NESTED|ctaTupleOrig, tuple(src, dst))
		ae.Bytes(unix.NLA_F_NESTED|ctaTupleReply, tuple(ep, src))
		ae.Uint32(ctaTimeout, 30)
		ae.Uint32(ctaID, 7)
		ae.Uint16(ctaZone, 1)
		b, _ := ae.Encode()
		return b
	}
	ap := netip.MustParseAddrPort
	f.Add(uint8(unix.AF_INET), enc(unix.IPPROTO_UDP, ap("198.51.100.2:4000"), ap("10.96.0.10:53"), ap("10.244.1.2:53")))
	f.Add(uint8(unix.AF_INET6), enc(unix.IPPROTO_SCTP, ap("[fd00:c::2]:4000"), ap("[fd00:96::10]:90"), ap("[fd00:244:1::2]:9000")))
	f.Fuzz(func(t *testing.T, fam uint8, b []byte) {
		e, err := parseEntry(fam, b)
		if err != nil {
			return
		}
		fl := e.flow
		var fams []bool
		for _, a := range []netip.Addr{fl.Orig.Src.Addr(), fl.Orig.Dst.Addr(), fl.Reply.Src.Addr(), fl.Reply.Dst.Addr()} {
			if a.IsValid() {
				fams = append(fams, a.Is4())
			}
		}
		for _, v4 := range fams {
			if v4 != fams[0] {
				t.Fatalf("flow %s mixes families", fl)
			}
		}
	})
}
