package agent

import "github.com/kproxy-dev/kproxy/nftables"

// openNFTables opens the nftables backend; it clears stale UDP and SCTP
// flows through a conntrack client of its own.
func openNFTables(o BackendOptions) (Dataplane, error) {
	return nftables.New(nftables.Options{NetNS: o.NetNS, Logger: o.Logger})
}
