package ipvs

import (
	"log/slog"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/conntrack"
)

// Defaults of Options.
const (
	DefaultInterface       = "kproxy-ipvs0"
	DefaultSetPrefix       = "kproxy-ipvs-"
	DefaultChainPrefix     = "KPROXY-IPVS-"
	DefaultGracefulTimeout = 15 * time.Minute
	// DefaultScheduler serves the empty scheduler hint: weighted round
	// robin, which is round robin when the weights are equal.
	DefaultScheduler = "wrr"
	// DefaultFWMarkMask gives the proxier 4095 firewall marks per family,
	// 0x10000 to 0xfff0000: clear of kube-proxy's masquerade (0x4000) and
	// drop (0x8000) bits.
	DefaultFWMarkMask = 0x0fff0000
)

// Name limits of the kernel objects the proxier names.
const (
	maxInterfaceLen = 15 // IFNAMSIZ - 1
	maxSetNameLen   = 31 // IPSET_MAXNAMELEN - 1
	maxChainNameLen = 28 // iptables' limit
)

// Options configure a Proxier. The zero value of each field means its
// default.
type Options struct {
	// Interface is the dummy link that holds every virtual address the
	// proxier serves (cluster, external, load-balancer and node-port
	// addresses). Only the IPVS virtual servers whose address sits on it
	// belong to the proxier. The proxier creates it when it is missing; a
	// dummy link of that name that someone else made serves too, and
	// Cleanup leaves it (without its addresses). Default
	// DefaultInterface.
	Interface string
	// NetNS is the network namespace to program. The zero value (and
	// netns.None()) mean the namespace of the thread that calls New. New
	// duplicates the handle: the caller may close its own.
	NetNS netns.NsHandle
	// SetPrefix starts the name of every ipset the proxier owns. Default
	// DefaultSetPrefix.
	SetPrefix string
	// ChainPrefix starts the name of every iptables chain the proxier owns.
	// Default DefaultChainPrefix.
	ChainPrefix string
	// VerifyInterval is the least time between two deep checks of what
	// the proxier owns (the link's addresses, every virtual server, the
	// sets' headers); zero means one minute. Every Sync looks up the dummy
	// link and the helper rules' generation in any case.
	VerifyInterval time.Duration
	// StrictARP sets net.ipv4.conf.all.arp_ignore=1 and arp_announce=2 in
	// the namespace, so that the node does not answer ARP requests for the
	// virtual addresses of its dummy link on its other links. Use it when
	// another node or a load balancer announces the same addresses.
	StrictARP bool
	// GracefulTimeout bounds how long a removed real server keeps serving
	// its open connections (at weight 0) before it is deleted: a TCP one,
	// or a UDP or SCTP one whose endpoint still serves. Default
	// DefaultGracefulTimeout.
	GracefulTimeout time.Duration
	// LeaveSysctls stops the proxier from writing the IPVS sysctls it needs
	// (net.ipv4.vs.conntrack=1, expire_nodest_conn=1,
	// expire_quiescent_template=1, and the StrictARP ones): Sync then only
	// checks them and fails with ErrSysctl when one differs.
	LeaveSysctls bool
	// FWMarkMask holds the packet mark bits of the firewall marks the
	// proxier gives the IPVS firewall-mark virtual servers that take the
	// flows of pods and of the node to a port whose verdict for them
	// differs from the one for outside clients (the external Local
	// policy): every value of these bits but zero is a mark. IPVS looks
	// these virtual servers up by the whole packet mark, so the proxier
	// sets the whole mark of the flows it steers, and every firewall-mark
	// virtual server with a mark of these bits is the proxier's. The
	// bits must be used by nobody else in the namespace (no other
	// program's marks, no ip rule, another proxier in the namespace
	// another mask) and must not hold the node's masquerade mark. A
	// port's mark is chosen from a hash of its name, so that a restarted
	// proxier gives the same marks. Default DefaultFWMarkMask.
	FWMarkMask uint32
	// NoConntrackCleanup turns off the deletion of stale UDP and SCTP
	// conntrack flows (servicelb.StaleFlow).
	NoConntrackCleanup bool
	// Conntrack deletes those flows; nil means a conntrack.Client of the
	// proxier's own in its namespace, opened by New.
	Conntrack conntrack.FlowCleaner
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
}
