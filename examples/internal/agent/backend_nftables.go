package agent

import (
	"context"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func openNFTables(o BackendOptions) (Dataplane, error) {
	ct, err := conntrack.New(conntrack.Options{NetNS: o.NetNS, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	p, err := nftables.New(nftables.Options{NetNS: o.NetNS, Logger: o.Logger, Conntrack: flowCleaner{ct}})
	if err != nil {
		ct.Close()
		return nil, err
	}
	return &withConntrack{Dataplane: p, ct: ct}, nil
}

// flowCleaner adapts a conntrack client to nftables.FlowCleaner.
type flowCleaner struct{ c *conntrack.Client }

func (f flowCleaner) DeleteStale(ctx context.Context, flows []servicelb.StaleFlow) error {
	_, err := f.c.DeleteStale(ctx, flows)
	return err
}
