package ebpf

import (
	"log/slog"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Options configure a Proxier.
type Options struct {
	// Cgroup is the cgroup v2 directory the hooks are attached to: the
	// sockets of every process in it and below are balanced. An agent
	// passes the root of its workloads' cgroups (the whole node's is the
	// root of the hierarchy). Required.
	Cgroup string
	// PinPath, when set, is a directory on a bpf filesystem that the
	// Proxier owns: it pins its maps and links there, so that they
	// outlive the process, and a new Proxier with the same PinPath adopts
	// them without a moment unbalanced. Empty means no pins: the hooks
	// are detached when the Proxier is closed.
	PinPath string
	// NetNS is the node's network namespace: sockets in it are the node's
	// own (servicelb.FromNode), sockets in any other are pods'
	// (servicelb.FromPod; see Limits in the package documentation for
	// the local-traffic detection modes other than the cluster CIDR).
	// Zero means the caller's.
	NetNS netns.NsHandle
	// Packets, when set, is the packet-path Proxier (package nftables'
	// in the node's namespace) that serves what sockets do not: traffic
	// from other hosts, and the flows the hooks leave alone (see the
	// package documentation). The Proxier then syncs, cleans up, closes
	// and renders it too, and its Capabilities are the pair's.
	Packets servicelb.Proxier
	// Sizes bound the maps.
	Sizes Sizes
	// Logger receives state changes at Info and per-sync detail at Debug;
	// nil discards.
	Logger *slog.Logger
	// VerifyInterval is the least time between two deep checks by syncs
	// that change something (the pins looked up, every map entry read
	// back); a sync that changes nothing checks deeply. Zero means one
	// minute.
	VerifyInterval time.Duration
}

// Sizes bounds the maps (their max_entries). The hash maps are not
// preallocated: they take memory as they fill, besides an array of 16
// bytes per entry they may hold (the kernel's buckets). The LRU maps are
// preallocated.
type Sizes struct {
	// Frontends bounds the frontends of every service port, of both
	// families, and the sets; default 1<<16.
	Frontends uint32
	// Slots bounds the slots of every set (one per endpoint of weight 1),
	// and the endpoints of the sets with affinity; default 1<<18.
	Slots uint32
	// Affinity bounds the ClientIP pins (an LRU: the least recently used
	// goes first); default 1<<14.
	Affinity uint32
	// Reverse bounds the sockets whose peer is shown as the service's
	// address (an LRU; a socket whose entry went shows the endpoint's
	// address); default 1<<16.
	Reverse uint32
}

// maxSlots is the number of slots a set of endpoints with unequal weights
// is spread over: weights are honoured to about 1/maxSlots of a set's
// flows. Endpoints of equal weight take one slot each.
const maxSlots = 4096

// MaxEndpoints bounds the endpoints of a set (a service port's cluster
// or local endpoints).
const MaxEndpoints = maxSlots
