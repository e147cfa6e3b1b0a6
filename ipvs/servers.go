package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// VirtualServer is one IPVS virtual server: the flows it takes, how it
// spreads them, and its real servers. An address virtual server takes the
// flows to its address, protocol and port; a firewall-mark virtual server
// (FWMark not zero) takes the flows of its family whose packet mark is
// FWMark, whatever their address, protocol and port, and IPVS looks it up
// first.
type VirtualServer struct {
	Addr     netip.Addr
	Protocol servicelb.Protocol
	Port     uint16
	// FWMark and Family name a firewall-mark virtual server; Addr and
	// Port are then unset, and Protocol is that of the flows the proxier
	// steers to it (IPVS itself does not hold it).
	FWMark uint32
	Family servicelb.Family
	// Scheduler is the IPVS scheduler's name, such as "rr".
	Scheduler string
	// HashPort makes a hashing scheduler (mh) hash the client's port with
	// its address, so that one client's flows spread (IPVS's sched flag
	// mh-port).
	HashPort bool
	// Persistence is the ClientIP affinity timeout in seconds; zero means
	// no affinity.
	Persistence uint32
	// Real are the real servers, ordered by address and port.
	Real []RealServer
	// serving are the endpoints (address and port) serving the port,
	// sorted: a removed UDP or SCTP real server among them drains (see
	// removals).
	serving []netip.AddrPort
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

// vsKey identifies a virtual server: by address, protocol and port, or by
// firewall mark and family.
type vsKey struct {
	addr   netip.Addr
	proto  servicelb.Protocol
	port   uint16
	fwmark uint32
	family servicelb.Family
}

func (vs *VirtualServer) key() vsKey {
	if vs.FWMark != 0 {
		return vsKey{fwmark: vs.FWMark, family: vs.Family}
	}
	return vsKey{addr: vs.Addr, proto: vs.Protocol, port: vs.Port}
}

// family returns the virtual server's address family.
func (vs *VirtualServer) family() servicelb.Family {
	if vs.FWMark != 0 {
		return vs.Family
	}
	return servicelb.FamilyOf(vs.Addr)
}

// String formats the key as ipvsadm names a service: "-t 10.96.0.10:80",
// "-u [fd00::10]:53", "--sctp-service 10.96.0.10:9", "-f 65536",
// "-f 65536 -6".
func (k vsKey) String() string {
	if k.fwmark != 0 {
		if k.family == servicelb.IPv6 {
			return fmt.Sprintf("-f %d -6", k.fwmark)
		}
		return fmt.Sprintf("-f %d", k.fwmark)
	}
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
	return a.Scheduler == b.Scheduler && a.Persistence == b.Persistence && a.HashPort == b.HashPort
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
