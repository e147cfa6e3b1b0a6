package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The helper sets, by base name. Each exists once per family, named
// <SetPrefix><base>-4 or -6.
const (
	// setClusterIP holds cluster IP,protocol:port of every service port.
	setClusterIP = "cluster-ip"
	// setExternal holds address,protocol:port of external IPs,
	// load-balancer IPs and node ports under the Cluster external policy:
	// their traffic is masqueraded.
	setExternal = "external"
	// setExternalLocal holds the same under the Local external policy:
	// their traffic keeps its source address.
	setExternalLocal = "external-local"
	// setLBFirewall holds load-balancer IP,protocol:port of services with
	// source ranges.
	setLBFirewall = "lb-fw"
	// setLBSource holds load-balancer IP,protocol:port,source range
	// allowed, the node's own addresses included.
	setLBSource = "lb-source-range"
	// setLoopBack holds endpoint,protocol:port,endpoint: an endpoint
	// reaching itself through a service (hairpin), masqueraded.
	setLoopBack = "loop-back"
	// setVIP holds the virtual addresses that are not node addresses:
	// new connections to their unserved ports are rejected.
	setVIP = "vip"
	// setDrop holds address,protocol:port of virtual servers left without
	// real servers by a Local traffic policy while the port has endpoints
	// elsewhere: their traffic is dropped.
	setDrop = "drop"
)

// setSpec describes one helper set.
type setSpec struct {
	base, typ, comment string
}

// setSpecs lists the helper sets in rendering order.
func setSpecs() []setSpec {
	return []setSpec{
		{setClusterIP, "hash:ip,port", "cluster IPs and ports"},
		{setExternal, "hash:ip,port", "external addresses and ports, masqueraded"},
		{setExternalLocal, "hash:ip,port", "external addresses and ports, Local policy"},
		{setLBFirewall, "hash:ip,port", "load-balancer addresses and ports with source ranges"},
		{setLBSource, "hash:ip,port,net", "allowed sources of load-balancer addresses and ports"},
		{setLoopBack, "hash:ip,port,ip", "endpoints reaching themselves"},
		{setVIP, "hash:ip", "virtual addresses"},
		{setDrop, "hash:ip,port", "virtual servers dropped by a Local policy"},
	}
}

func maxSetSuffixLen() int {
	n := 0
	for _, s := range setSpecs() {
		n = max(n, len(s.base))
	}
	return n + len("-4")
}

// setName returns the kernel name of a helper set.
func setName(prefix, base string, f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return prefix + base + "-6"
	}
	return prefix + base + "-4"
}

// setEntry is one member of a helper set. Which fields are set depends on
// the set's type: addr (hash:ip), addr,proto:port (hash:ip,port),
// addr,proto:port,addr2 (hash:ip,port,ip) or addr,proto:port,net
// (hash:ip,port,net).
type setEntry struct {
	set    string
	family servicelb.Family
	addr   netip.Addr
	proto  servicelb.Protocol
	port   uint16
	addr2  netip.Addr
	net    netip.Prefix
}

// String formats the entry as ipset prints it.
func (e setEntry) String() string {
	s := e.addr.String()
	if e.proto != "" {
		s += fmt.Sprintf(",%s:%d", e.proto.Lower(), e.port)
	}
	switch {
	case e.addr2.IsValid():
		s += "," + e.addr2.String()
	case e.net.IsValid() && e.net.IsSingleIP():
		s += "," + e.net.Addr().String()
	case e.net.IsValid():
		s += "," + e.net.String()
	}
	return s
}

func compareEntries(a, b setEntry) int {
	return cmp.Or(cmp.Compare(a.set, b.set), cmp.Compare(a.family, b.family), a.addr.Compare(b.addr),
		cmp.Compare(a.proto.Number(), b.proto.Number()), cmp.Compare(a.port, b.port),
		a.addr2.Compare(b.addr2), a.net.Addr().Compare(b.net.Addr()), cmp.Compare(a.net.Bits(), b.net.Bits()))
}
