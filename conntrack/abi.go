package conntrack

// The kernel's values this package speaks, defined here so that the
// package builds on any system (elsewhere New fails, having no netlink).
const (
	netlinkNetfilter    = 12 // NETLINK_NETFILTER
	nfnlSubsysCtnetlink = 1  // NFNL_SUBSYS_CTNETLINK
	nfnetlinkV0         = 0  // NFNETLINK_V0
	afInet              = 2  // AF_INET
	afInet6             = 10 // AF_INET6 (Linux's)

	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
	protoSCTP   = 132
)
