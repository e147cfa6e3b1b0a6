//go:build linux

package iptables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/xtables"
)

// Probe checks, changing nothing, that a Proxier with these options can
// work: the options are valid (ErrInvalidOptions), the kernel has
// nf_tables in Options.NetNS and nft_compat with every xtables match and
// target the rules call, in both families (else a
// *servicelb.FeatureError naming the first missing, errors.Is
// ErrNotSupported), and the process may program it (else
// servicelb.ErrPermission). It asks the kernel what iptables asks before
// it writes a rule: the ruleset's generation and each extension's
// revision. The kernel may load the modules that provide them, as the
// first Sync would.
func Probe(o Options) error {
	if err := o.normalize(); err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	if err := probe(o); err != nil {
		return fmt.Errorf("iptables: probe: %w", err)
	}
	return nil
}

func probe(o Options) error {
	feature, err := xtables.Probe(context.Background(), int(o.NetNS), false)
	return privilege.Feature(err, feature, "a kernel with CONFIG_NF_TABLES, CONFIG_NFT_COMPAT and the extension (modprobe nft_compat)")
}
