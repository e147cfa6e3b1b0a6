package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// VirtualServer is one IPVS virtual server: a virtual address, protocol and
// port, how it spreads connections, and its real servers.
type VirtualServer struct {
	Addr     netip.Addr
	Protocol servicelb.Protocol
	Port     uint16
	// Scheduler is the IPVS scheduler's name, such as "rr".
	Scheduler string
	// Persistence is the ClientIP affinity timeout in seconds; zero means
	// no affinity.
	Persistence uint32
	// Real are the real servers, ordered by address and port.
	Real []RealServer
}

// RealServer is one real server (endpoint) of a virtual server, reached by
// masquerading (IPVS NAT).
type RealServer struct {
	Addr   netip.Addr
	Port   uint16
	Weight uint16
}

// AddrPort returns the real server's address and port.
func (r RealServer) AddrPort() netip.AddrPort { return netip.AddrPortFrom(r.Addr, r.Port) }

// vsKey identifies a virtual server.
type vsKey struct {
	addr  netip.Addr
	proto servicelb.Protocol
	port  uint16
}

func (vs *VirtualServer) key() vsKey { return vsKey{vs.Addr, vs.Protocol, vs.Port} }

// String formats the key as ipvsadm names a service: "-t 10.96.0.10:80",
// "-u [fd00::10]:53", "--sctp-service 10.96.0.10:9".
func (k vsKey) String() string {
	return protoSwitch(k.proto) + " " + netip.AddrPortFrom(k.addr, k.port).String()
}

// String formats the virtual server as its `ipvsadm -Sn` lines.
func (vs *VirtualServer) String() string {
	var b strings.Builder
	writeVirtualServer(&b, vs)
	return b.String()
}

func protoSwitch(p servicelb.Protocol) string {
	switch p {
	case servicelb.TCP:
		return "-t"
	case servicelb.UDP:
		return "-u"
	case servicelb.SCTP:
		return "--sctp-service"
	}
	return fmt.Sprintf("--protocol-%s", p)
}

// sameService reports whether two virtual servers have the same settings,
// real servers aside.
func sameService(a, b *VirtualServer) bool {
	return a.Scheduler == b.Scheduler && a.Persistence == b.Persistence
}

// realIndex returns the real server of vs at addr and port, or -1.
func (vs *VirtualServer) realIndex(ap netip.AddrPort) int {
	return slices.IndexFunc(vs.Real, func(r RealServer) bool { return r.AddrPort() == ap })
}

func compareReal(a, b RealServer) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

// clone returns a deep copy.
func (vs *VirtualServer) clone() *VirtualServer {
	c := *vs
	c.Real = slices.Clone(vs.Real)
	return &c
}
