//go:build linux

package ipvs

import (
	"cmp"
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The helper sets, by base name. Each exists once per family, named
// <SetPrefix><base>-4 or -6. Entries of address,protocol:port are
// frontends.
const (
	// setFrontends holds every frontend: the address virtual servers the
	// proxier owns (on node addresses too) and the traffic the virtual
	// address filter lets in.
	setFrontends = "frontends"
	// setMasq holds the frontends whose flows are masqueraded from every
	// origin; setMasqOutside, setMasqPod and setMasqNode those masqueraded
	// from one origin only.
	setMasq        = "masq"
	setMasqOutside = "masq-outside"
	setMasqPod     = "masq-pod"
	setMasqNode    = "masq-node"
	// setDrop holds the frontends whose flows from outside are dropped:
	// every flow to them that no mark steers elsewhere is.
	setDrop = "drop"
	// setLBFirewall holds load-balancer frontends with source ranges.
	setLBFirewall = "lb-fw"
	// setLBSource holds load-balancer IP,protocol:port,source range
	// allowed.
	setLBSource = "lb-source-range"
	// setLoopBack holds endpoint,protocol:port,endpoint: an endpoint
	// reaching itself through a service (hairpin), masqueraded.
	setLoopBack = "loop-back"
	// setVIP holds the virtual addresses that are not node addresses:
	// new connections to their unserved ports are rejected.
	setVIP = "vip"
)

// setSpec describes one helper set.
type setSpec struct {
	base, typ, comment string
}

// setSpecs lists the helper sets in rendering order.
func setSpecs() []setSpec {
	return []setSpec{
		{setFrontends, "hash:ip,port", "frontends"},
		{setMasq, "hash:ip,port", "frontends masqueraded from every origin"},
		{setMasqOutside, "hash:ip,port", "frontends masqueraded from outside"},
		{setMasqPod, "hash:ip,port", "frontends masqueraded from pods"},
		{setMasqNode, "hash:ip,port", "frontends masqueraded from the node"},
		{setDrop, "hash:ip,port", "frontends dropped from outside"},
		{setLBFirewall, "hash:ip,port", "load-balancer frontends with source ranges"},
		{setLBSource, "hash:ip,port,net", "allowed sources of load-balancer frontends"},
		{setLoopBack, "hash:ip,port,ip", "endpoints reaching themselves"},
		{setVIP, "hash:ip", "virtual addresses"},
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
