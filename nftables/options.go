package nftables

import (
	"log/slog"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/conntrack"
)

// DefaultTable is the name of the table a Proxier owns by default.
const DefaultTable = "kproxy"

// DefaultAffinitySize bounds the number of ClientIP affinity pins per
// address family.
const DefaultAffinitySize = 1 << 18

// Options configure a Proxier. The zero value is usable: the table
// "kproxy" in the caller's network namespace, stale flows deleted, no
// logging.
type Options struct {
	// Table is the name of the inet table the Proxier owns; default
	// DefaultTable. Two Proxiers with different tables coexist in one
	// namespace.
	Table string
	// NetNS is the network namespace to program; zero (or netns.None())
	// means the caller's.
	NetNS netns.NsHandle
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
	// NoConntrackCleanup turns off the deletion of stale UDP and SCTP
	// flows (see servicelb.StaleFlow) after each successful sync.
	NoConntrackCleanup bool
	// Conntrack deletes the stale flows; nil means a conntrack.Client of
	// its own in NetNS, opened by New.
	Conntrack conntrack.FlowCleaner
	// VerifyInterval is the least time between two deep checks of the
	// table (every chain, rule, set and element read back), which a Sync
	// makes when another writer committed since the last one; zero means
	// one minute. Every Sync checks cheaply (the ruleset generation, the
	// table's flags and object count) in any case.
	VerifyInterval time.Duration
	// AffinitySize bounds the number of affinity pins per address family;
	// zero means DefaultAffinitySize. A client that comes while the set is
	// full reaches an endpoint unpinned, until pins expire.
	AffinitySize uint32
}
