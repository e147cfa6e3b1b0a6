package agent

import (
	"github.com/kproxy-dev/kproxy/iptables"
)

// openIPTables opens the iptables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openIPTables(o BackendOptions) (Dataplane, error) {
	return iptables.New(iptables.Options{NetNS: o.NetNS, Logger: o.Logger, ConntrackTCPLiberal: o.ConntrackTCPLiberal})
}

// renderIPTables renders the chains without a socket.
func renderIPTables(o BackendOptions) (Renderer, error) {
	return iptables.ForRendering(iptables.Options{Logger: o.Logger, ConntrackTCPLiberal: o.ConntrackTCPLiberal})
}
