package agent

import "github.com/kproxy-dev/kproxy/nftables"

// openNFTables opens the nftables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openNFTables(o BackendOptions) (Dataplane, error) {
	return nftables.New(nftables.Options{NetNS: o.NetNS, Logger: o.Logger})
}

// renderNFTables renders the table without a socket.
func renderNFTables(o BackendOptions) (Renderer, error) {
	return nftables.ForRendering(nftables.Options{Logger: o.Logger})
}
