package agent

import (
	"github.com/kproxy-dev/kproxy/iptables"
)

// iptablesOptions are the iptables backend's options for o.
func iptablesOptions(o BackendOptions) iptables.Options {
	return iptables.Options{NetNS: o.NetNS, Logger: o.Logger, ConntrackTCPLiberal: o.ConntrackTCPLiberal}
}

// probeIPTables checks what the iptables backend needs, changing nothing.
func probeIPTables(o BackendOptions) error { return iptables.Probe(iptablesOptions(o)) }

// openIPTables opens the iptables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openIPTables(o BackendOptions) (Dataplane, error) { return iptables.New(iptablesOptions(o)) }

// renderIPTables renders the chains without a socket.
func renderIPTables(o BackendOptions) (Renderer, error) {
	return iptables.ForRendering(iptables.Options{Logger: o.Logger, ConntrackTCPLiberal: o.ConntrackTCPLiberal})
}
