package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// RenderVirtualServers formats virtual servers exactly as `ipvsadm -Sn`
// prints them, in its order: address virtual servers by family, protocol,
// address and port, then firewall-mark ones by mark and family. ipvsadm
// compares addresses by the sign of their 32-bit wrapped difference; the
// order is well defined (and equal to ipvsadm's) when the addresses of
// each protocol and family span less than half of the 32-bit space, as in
// any usual address plan.
func RenderVirtualServers(servers []*VirtualServer) string {
	vs := slices.Clone(servers)
	slices.SortFunc(vs, func(a, b *VirtualServer) int { return compareKeys(a.key(), b.key()) })
	slices.SortStableFunc(vs, compareIpvsadm)
	var b strings.Builder
	for _, v := range vs {
		writeVirtualServer(&b, v)
	}
	return b.String()
}

func writeVirtualServer(b *strings.Builder, vs *VirtualServer) {
	name := vs.key().String()
	fmt.Fprintf(b, "-A %s -s %s", name, vs.Scheduler)
	if vs.Persistence > 0 {
		fmt.Fprintf(b, " -p %d", vs.Persistence)
	}
	if vs.HashPort {
		fmt.Fprintf(b, " -b %s-port", vs.Scheduler)
	}
	b.WriteString("\n")
	real := slices.Clone(vs.Real)
	slices.SortStableFunc(real, func(x, y RealServer) int {
		return cmp.Or(compareWrapped(x.Addr, y.Addr), cmp.Compare(x.Port, y.Port))
	})
	for _, r := range real {
		fmt.Fprintf(b, "-a %s -r %s -m -w %d\n", name, r.AddrPort(), r.Weight)
	}
}

// compareIpvsadm orders virtual servers as ipvsadm does: by firewall mark
// (as a signed difference, none first), family, protocol number (IPVS
// gives firewall-mark ones TCP's), address and port.
func compareIpvsadm(a, b *VirtualServer) int {
	ap, bp := a.Protocol.Number(), b.Protocol.Number()
	if a.FWMark != 0 {
		ap = servicelb.TCP.Number()
	}
	if b.FWMark != 0 {
		bp = servicelb.TCP.Number()
	}
	return cmp.Or(cmp.Compare(int32(a.FWMark-b.FWMark), 0),
		cmp.Compare(a.family(), b.family()), cmp.Compare(ap, bp),
		compareWrapped(a.Addr, b.Addr), cmp.Compare(a.Port, b.Port))
}

// compareWrapped compares two addresses of one family 32 bits at a time,
// by the sign of the wrapped difference, as ipvsadm's sort does; invalid
// addresses (of firewall-mark virtual servers) are equal.
func compareWrapped(a, b netip.Addr) int {
	x, y := a.AsSlice(), b.AsSlice()
	for i := 0; i+4 <= len(x) && i+4 <= len(y); i += 4 {
		wx := uint32(x[i])<<24 | uint32(x[i+1])<<16 | uint32(x[i+2])<<8 | uint32(x[i+3])
		wy := uint32(y[i])<<24 | uint32(y[i+1])<<16 | uint32(y[i+2])<<8 | uint32(y[i+3])
		if d := int32(wx - wy); d != 0 {
			return cmp.Compare(d, 0)
		}
	}
	return 0
}

func compareKeys(a, b vsKey) int {
	return cmp.Or(cmp.Compare(a.fwmark, b.fwmark), cmp.Compare(a.family, b.family),
		a.addr.Compare(b.addr), cmp.Compare(a.proto, b.proto), cmp.Compare(a.port, b.port))
}
