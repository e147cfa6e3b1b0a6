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
	p, err := nftables.New(nftables.Options{NetNS: o.NetNS, Logger: o.Logger, Conntrack: cleanerFor(ct)})
	if err != nil {
		ct.Close()
		return nil, err
	}
	return &withConntrack{Dataplane: p, ct: ct}, nil
}

// cleanerFor returns the conntrack client as an nftables.FlowCleaner:
// itself when its DeleteStale has the interface's signature, else through
// an adapter that drops the count of deleted flows.
func cleanerFor(ct *conntrack.Client) nftables.FlowCleaner {
	if fc, ok := any(ct).(nftables.FlowCleaner); ok {
		return fc
	}
	fc, _ := any(countless{ct}).(nftables.FlowCleaner)
	return fc
}

// countless adapts a conntrack client to a cleaner that returns only an
// error.
type countless struct{ c *conntrack.Client }

func (f countless) DeleteStale(ctx context.Context, flows []servicelb.StaleFlow) error {
	_, err := f.c.DeleteStale(ctx, flows)
	return err
}
