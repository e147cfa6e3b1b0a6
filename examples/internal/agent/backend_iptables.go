package agent

import (
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// openIPTables opens the iptables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openIPTables(o BackendOptions) (Dataplane, error) {
	return iptables.New(iptables.Options{NetNS: o.NetNS, Logger: o.Logger})
}

// renderIPTables renders the chains without a socket.
func renderIPTables(o BackendOptions) (Renderer, error) {
	var p *iptables.Proxier // its capabilities need no kernel
	return offlineRenderer{render: func(st *servicelb.State) (string, error) {
		return iptables.Render(st, iptables.Options{Logger: o.Logger})
	}, caps: p.Capabilities()}, nil
}
