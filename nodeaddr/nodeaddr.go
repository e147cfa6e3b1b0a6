// Package nodeaddr follows the addresses of a network namespace's
// interfaces, which a node proxy needs to serve node ports on every local
// address of the node, or on those inside some CIDRs, as kube-proxy's
// nodePortAddresses does: feed them to servicelb as NodeConfig.LocalIPs
// (Runner.SetNode), and an address added to an interface serves node ports
// from the next sync on.
//
//	w := nodeaddr.Watcher{Options: nodeaddr.Options{NetNS: ns}}
//	go w.Run(ctx, func(addrs []netip.Addr) {
//		node.LocalIPs = addrs
//		if err := runner.SetNode(node); err != nil { ... }
//	})
//
// The addresses are every unicast address of every interface but the
// excluded ones (an IPVS proxier's dummy link holds service addresses, not
// the node's), without loopback and IPv6 link-local addresses, which
// cannot serve node ports (see servicelb.NodeConfig.LocalhostNodePorts for
// 127.0.0.1).
package nodeaddr

import (
	"errors"
	"log/slog"
	"time"

	"github.com/vishvananda/netns"
)

// ErrNotSupported: the system has no netlink (not Linux).
var ErrNotSupported = errors.New("nodeaddr: not supported on this system")

// Options say whose addresses to follow.
type Options struct {
	// NetNS is the node's network namespace; zero means the caller's.
	NetNS netns.NsHandle
	// ExcludeInterfaces names links whose addresses are not the node's.
	ExcludeInterfaces []string
	// Logger receives subscription errors at Warn; nil discards.
	Logger *slog.Logger
}

// Watcher follows the addresses of a namespace. Its zero Options follow
// the caller's namespace.
type Watcher struct {
	Options
	// Settle is how long Run waits for more changes after one before it
	// lists the addresses again; default 100ms, so that an interface
	// brought up with several addresses makes one update.
	Settle time.Duration
	// Retry is the wait before subscribing again after the subscription
	// failed; default 1s.
	Retry time.Duration
}
