package syncer

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// pendingFlows holds the stale-flow filters not deleted yet, one per UDP
// or SCTP frontend. Each keeps the flows of the endpoints that serve its
// frontend in the state last applied: a sync brings the filters of the
// frontends it touches up to date, so that a deletion retried after a
// failure never cuts the flows of an endpoint that serves again.
type pendingFlows struct {
	m map[flowKey]servicelb.StaleFlow
}

// flowKey is a frontend of a stale-flow filter.
type flowKey struct {
	proto servicelb.Protocol
	dst   netip.Addr
	port  uint16
}

func (pf *pendingFlows) empty() bool { return len(pf.m) == 0 }

func (pf *pendingFlows) clear() { pf.m = nil }

// add records filters, each replacing the pending one of its frontend.
func (pf *pendingFlows) add(fs []servicelb.StaleFlow) {
	if pf.m == nil && len(fs) > 0 {
		pf.m = make(map[flowKey]servicelb.StaleFlow, len(fs))
	}
	for _, f := range fs {
		pf.m[flowKey{f.Protocol, f.Dst, f.Port}] = f
	}
}

// refresh updates the pending filters of the frontends ch touches: one
// that stays keeps the endpoints serving it now; one that went, or that
// no endpoint serves any more, deletes no flow (servicelb.StaleFlow).
func (pf *pendingFlows) refresh(ch *servicelb.Changes) {
	if pf.empty() {
		return
	}
	// set gives the pending filters of sp's frontends the endpoints
	// serving sp (none when it went), read once sp has one.
	set := func(sp *servicelb.ServicePort, stays bool) {
		var serving []netip.AddrPort
		read := false
		for f := range sp.AllFrontends() {
			k := flowKey{sp.Port.Protocol, f.Addr, f.Port}
			if x, ok := pf.m[k]; ok {
				if stays && !read {
					serving, read = sp.ServingEndpoints(), true
				}
				x.Serving = serving
				pf.m[k] = x
			}
		}
	}
	for _, sp := range ch.Removed {
		set(sp, false)
	}
	for _, c := range ch.Changed {
		set(c.Old, false)
	}
	for _, c := range ch.Changed {
		set(c.New, true)
	}
	for _, sp := range ch.Added {
		set(sp, true)
	}
	maps.DeleteFunc(pf.m, func(_ flowKey, x servicelb.StaleFlow) bool { return len(x.Serving) == 0 })
}

// reset makes the pending filters those that reconcile the whole
// conntrack table with st: one per frontend of st that endpoints serve.
func (pf *pendingFlows) reset(st *servicelb.State) {
	pf.clear()
	pf.add(st.StaleFlows())
}

// list returns the pending filters in a stable order.
func (pf *pendingFlows) list() []servicelb.StaleFlow {
	out := slices.Collect(maps.Values(pf.m))
	slices.SortFunc(out, func(a, b servicelb.StaleFlow) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.Dst.Compare(b.Dst), cmp.Compare(a.Port, b.Port))
	})
	return out
}
