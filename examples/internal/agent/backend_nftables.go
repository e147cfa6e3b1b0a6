package agent

import "github.com/kproxy-dev/kproxy/nftables"

// nftablesOptions are the nftables backend's options for o.
func nftablesOptions(o BackendOptions) nftables.Options {
	return nftables.Options{NetNS: o.NetNS, Logger: o.Logger}
}

// probeNFTables checks what the nftables backend needs, changing nothing.
func probeNFTables(o BackendOptions) error { return nftables.Probe(nftablesOptions(o)) }

// openNFTables opens the nftables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openNFTables(o BackendOptions) (Dataplane, error) { return nftables.New(nftablesOptions(o)) }

// renderNFTables renders the table without a socket.
func renderNFTables(o BackendOptions) (Renderer, error) {
	return nftables.ForRendering(nftables.Options{Logger: o.Logger})
}
