package ipvs

import (
	"cmp"
	"context"
	"maps"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// staleKey is a UDP or SCTP frontend whose stale flows are still to
// delete.
type staleKey struct {
	proto servicelb.Protocol
	dst   netip.Addr
	port  uint16
}

// addStale records the frontends of stale-flow filters. Only the
// frontend is kept: the endpoints whose flows stay are those serving it
// when the deletion runs, so that a deletion tried again after later syncs
// spares the endpoints that serve by then.
func (p *Proxier) addStale(flows []servicelb.StaleFlow) {
	if p.cleaner == nil {
		return
	}
	for _, f := range flows {
		p.stale[staleKey{f.Protocol, f.Dst, f.Port}] = true
	}
}

// cleanFlows deletes the stale flows recorded so far, with the endpoints
// serving each frontend in the applied state, and forgets them once
// deleted; a failure leaves them for the next Sync.
func (p *Proxier) cleanFlows(ctx context.Context) error {
	if len(p.stale) == 0 || p.cleaner == nil || p.plan == nil {
		return nil
	}
	keys := slices.SortedFunc(maps.Keys(p.stale), func(a, b staleKey) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), a.dst.Compare(b.dst), cmp.Compare(a.port, b.port))
	})
	flows := make([]servicelb.StaleFlow, len(keys))
	for i, k := range keys {
		flows[i] = servicelb.StaleFlow{Protocol: k.proto, Dst: k.dst, Port: k.port}
		flows[i].Serving = p.plan.serving(flows[i])
	}
	n, err := p.cleaner.DeleteStale(ctx, flows)
	if err != nil {
		return opErr("delete stale conntrack flows (tried again by the next Sync)", "", err)
	}
	clear(p.stale)
	p.log.Debug("ipvs: stale conntrack flows deleted", "filters", len(flows), "flows", n)
	return nil
}
