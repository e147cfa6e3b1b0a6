//go:build linux

package xtables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// Probe asks the kernel of the namespace netns (as nfnl.Options.NetNS)
// what iptables asks before it writes rules, changing nothing: the
// ruleset's generation, then the revision of every extension the encoder
// may write (Extensions) in both families. It returns nil, or the first
// feature missing, named, with the kernel's error.
func Probe(ctx context.Context, netns int, sets bool) (feature string, err error) {
	c, err := nfnl.Open(nfnl.Options{NetNS: netns})
	if err != nil {
		return "netlink netfilter", err
	}
	defer c.Close()
	if _, err := c.Generation(ctx); err != nil {
		return "nf_tables", err
	}
	for _, fam := range []nfnl.Family{nfnl.IPv4, nfnl.IPv6} {
		for _, x := range Extensions(sets) {
			if err := c.Extension(ctx, fam, x.Name, x.Rev, x.Target); err != nil {
				kind := "match"
				if x.Target {
					kind = "target"
				}
				return fmt.Sprintf("xtables %s %s (revision %d, through nft_compat)", kind, x.Name, x.Rev), err
			}
		}
	}
	return "", nil
}
