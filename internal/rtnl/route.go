//go:build linux

package rtnl

import (
	"context"
	"encoding/binary"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// rtmsg returns a struct rtmsg of family fam, destination length bits,
// in table (0 for none).
func rtmsg(fam, bits, table uint8) []byte {
	return []byte{fam, bits, 0, 0, table, 0, 0, 0, 0, 0, 0, 0}
}

// RouteOIF returns the index of the interface the namespace routes
// packets to a through, 0 when the route has none.
func (c *Conn) RouteOIF(ctx context.Context, a netip.Addr) (int, error) {
	fam := uint8(unix.AF_INET)
	if a.Is6() {
		fam = unix.AF_INET6
	}
	var b nl.Batch
	b.Message(unix.RTM_GETROUTE, 0, rtmsg(fam, uint8(a.BitLen()), 0)...)
	b.Addr(unix.RTA_DST, a)
	oif := 0
	err := c.c.Get(ctx, &b, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWROUTE || len(data) < unix.SizeofRtMsg {
			return nil
		}
		for at, v := range nl.Attrs(data[unix.SizeofRtMsg:]) {
			if at == unix.RTA_OIF && len(v) >= 4 {
				oif = int(binary.NativeEndian.Uint32(v))
			}
		}
		return nil
	})
	if err != nil {
		return 0, &OpError{Op: "get route", Object: a.String(), Err: err}
	}
	return oif, nil
}
