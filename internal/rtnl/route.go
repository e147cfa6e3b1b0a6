//go:build linux

package rtnl

import (
	"encoding/binary"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// RouteOIF returns the index of the interface the namespace routes
// packets to a through, 0 when the route has none.
func (c *Conn) RouteOIF(a netip.Addr) (int, error) {
	b, at := c.header(nil, unix.RTM_GETROUTE, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	fam, bits := byte(unix.AF_INET), byte(32)
	if a.Is6() {
		fam, bits = unix.AF_INET6, 128
	}
	b = append(b, fam, bits, 0, 0, 0, 0, 0, 0) // struct rtmsg
	b = binary.NativeEndian.AppendUint32(b, 0) // rtm_flags
	b = attr(b, unix.RTA_DST, a.AsSlice())
	oif := 0
	err := c.request(finish(b, at), func(m syscall.NetlinkMessage) {
		if m.Header.Type == unix.RTM_NEWROUTE && len(m.Data) >= unix.SizeofRtMsg {
			attrs(m.Data[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
				if typ == unix.RTA_OIF && len(v) >= 4 {
					oif = int(binary.NativeEndian.Uint32(v))
				}
			})
		}
	})
	if err != nil {
		return 0, &OpError{Op: "get route", Object: a.String(), Err: err}
	}
	return oif, nil
}
