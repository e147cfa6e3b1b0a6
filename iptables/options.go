package iptables

import (
	"log/slog"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// DefaultDropBit is the mark bit of MARK-DROP, as kubelet's
// --iptables-drop-bit: mark 0x8000.
const DefaultDropBit = 15

// Options configure a Proxier. The zero value is usable: chains named
// KPROXY-..., both families, the caller's network namespace.
type Options struct {
	// ChainPrefix starts every chain name, 1 to 8 characters of A-Z, 0-9,
	// '-' and '_'; empty means DefaultChainPrefix. With "KUBE-" the chains
	// are named as kube-proxy names them.
	ChainPrefix string
	// NetNS is the network namespace to program; a handle that is not
	// valid (zero or negative) means the caller's namespace.
	NetNS netns.NsHandle
	// Families lists the address families to program: their ip and ip6
	// tables; empty means both. Service ports of other families are left
	// out.
	Families []servicelb.Family
	// DropBit is the packet mark bit (0-31) that MARK-DROP sets for
	// PROXY-FIREWALL to drop; zero means DefaultDropBit. It must differ from
	// the node's masquerade bit.
	DropBit uint8
	// NoConntrackCleanup turns off the deletion of the conntrack flows a
	// sync leaves stale (see servicelb.StaleFlow).
	NoConntrackCleanup bool
	// ConntrackTCPLiberal says that the node's conntrack marks no
	// out-of-window TCP packet invalid (conntrack.Tuning.TCPBeLiberal):
	// P-FORWARD then drops no packet conntrack calls invalid, as
	// kube-proxy's iptables mode drops none under
	// --conntrack-tcp-be-liberal.
	ConntrackTCPLiberal bool
	// Conntrack deletes the stale flows; nil means a conntrack.Client of
	// its own in NetNS, opened by New.
	Conntrack conntrack.FlowCleaner
	// VerifyInterval is the least time between two deep checks of the
	// Proxier's chains (every rule read back), which a Sync makes when
	// another writer committed since the last one; zero means one minute.
	// Every Sync checks cheaply (the generation, the tables' object counts,
	// the jumps in the builtin chains) in any case.
	VerifyInterval time.Duration
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
	// conn, an xtables.Conn, replaces the netlink connection, for tests.
	conn any
}

// DefaultChainPrefix starts the name of every chain a Proxier owns.
