//go:build linux

package nftables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/privilege"
)

// Probe checks, changing nothing, that a Proxier with these options can
// work: the options are valid (ErrInvalidOptions), the kernel has
// nf_tables in Options.NetNS (else a *servicelb.FeatureError, errors.Is
// ErrNotSupported) and the process may program it (else
// servicelb.ErrPermission). It asks the kernel one question that changes
// nothing, the ruleset's generation; what only a write finds out (the nat
// chain type, a module the kernel cannot load) the first Sync reports.
func Probe(o Options) error {
	if _, err := newProxier(o); err != nil {
		return err
	}
	err := privilege.Feature(nfnl.Probe(context.Background(), nfnl.Options{NetNS: int(o.NetNS)}),
		"nf_tables", "a kernel with CONFIG_NF_TABLES (modprobe nf_tables)")
	if err != nil {
		return fmt.Errorf("nftables: probe: %w", err)
	}
	return nil
}
