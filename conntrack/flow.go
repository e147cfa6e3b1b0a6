package conntrack

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Tuple is one direction of a flow.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// Flow is one conntrack entry.
type Flow struct {
	Family servicelb.Family
	// Protocol is the IP protocol number (6 TCP, 17 UDP, 132 SCTP, ...).
	Protocol uint8
	// Orig is the direction of the first packet, as the client sent it:
	// its Dst is the service address before translation.
	Orig Tuple
	// Reply is the direction the answers take: after DNAT its Src is the
	// backend the flow was translated to.
	Reply Tuple
	// Mark is the connection mark.
	Mark uint32
	// Zone is the conntrack zone.
	Zone uint16
	// Timeout is how long the entry lives without further packets.
	Timeout time.Duration
}

// String formats the flow much as `conntrack -L` does.
func (f Flow) String() string {
	return fmt.Sprintf("%s src=%s dst=%s reply src=%s dst=%s mark=%#x zone=%d timeout=%v",
		protoName(f.Protocol), f.Orig.Src, f.Orig.Dst, f.Reply.Src, f.Reply.Dst, f.Mark, f.Zone, f.Timeout)
}

func protoName(p uint8) string {
	switch p {
	case protoTCP:
		return "tcp"
	case protoUDP:
		return "udp"
	case protoSCTP:
		return "sctp"
	case protoICMP:
		return "icmp"
	case protoICMPv6:
		return "icmpv6"
	}
	return fmt.Sprintf("proto(%d)", p)
}

// Matches reports whether the flow is one that s selects as stale: same
// protocol, original destination address and port, and a reply source
// (the endpoint's address and port) that s does not keep.
func (f Flow) Matches(s servicelb.StaleFlow) bool {
	return f.Protocol == s.Protocol.Number() && f.Orig.Dst.Port() == s.Port &&
		f.Orig.Dst.Addr() == s.Dst.Unmap() && !s.Keeps(f.Reply.Src)
}
