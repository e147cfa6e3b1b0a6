package conntrack

import (
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// portKey selects the stale-flow filters that can match a flow by its
// protocol and original destination port.
type portKey struct {
	proto uint8
	port  uint16
}

// dstMatch holds, for one destination (or any destination), the
// endpoints whose flows are stale, or any endpoint.
type dstMatch struct {
	anyEndpoint bool
	endpoints   map[netip.Addr]struct{}
}

// index holds the stale-flow filters of one family so that a flow is
// matched with at most two map lookups per level, whatever the number of
// filters: by protocol and port, then by destination (the flow's or the
// zero address for "any"), then by endpoint.
type index map[portKey]map[netip.Addr]*dstMatch

func (ix index) add(s servicelb.StaleFlow) {
	k := portKey{s.Protocol.Number(), s.Port}
	dsts := ix[k]
	if dsts == nil {
		dsts = map[netip.Addr]*dstMatch{}
		ix[k] = dsts
	}
	d := dsts[s.Dst.Unmap()]
	if d == nil {
		d = &dstMatch{endpoints: map[netip.Addr]struct{}{}}
		dsts[s.Dst.Unmap()] = d
	}
	if s.Endpoint.IsValid() {
		d.endpoints[s.Endpoint.Unmap()] = struct{}{}
	} else {
		d.anyEndpoint = true
	}
}

// matches reports whether any filter matches a flow given by its protocol,
// original destination and reply source.
func (ix index) matches(proto uint8, dst netip.AddrPort, replySrc netip.Addr) bool {
	dsts := ix[portKey{proto, dst.Port()}]
	if dsts == nil {
		return false
	}
	for _, d := range []*dstMatch{dsts[dst.Addr()], dsts[netip.Addr{}]} {
		if d == nil {
			continue
		}
		if d.anyEndpoint {
			return true
		}
		if _, ok := d.endpoints[replySrc]; ok {
			return true
		}
	}
	return false
}

// buildIndex validates stale-flow filters and indexes them by family. A
// filter whose destination and endpoint are both zero applies to both
// families. Nothing is indexed if any filter is invalid.
func buildIndex(stale []servicelb.StaleFlow) (map[servicelb.Family]index, error) {
	out := map[servicelb.Family]index{}
	for i, s := range stale {
		fams, err := families(s)
		if err != nil {
			return nil, &StaleFlowError{Index: i, Flow: s, Err: err}
		}
		for _, f := range fams {
			if out[f] == nil {
				out[f] = index{}
			}
			out[f].add(s)
		}
	}
	return out, nil
}

// families validates a filter and returns the families it applies to.
func families(s servicelb.StaleFlow) ([]servicelb.Family, error) {
	switch {
	case s.Protocol.Number() == 0:
		return nil, fmt.Errorf("%w: unknown protocol %q", ErrInvalidStaleFlow, s.Protocol)
	case s.Port == 0:
		return nil, fmt.Errorf("%w: port 0", ErrInvalidStaleFlow)
	case s.Dst.Zone() != "" || s.Endpoint.Zone() != "":
		return nil, fmt.Errorf("%w: zoned address", ErrInvalidStaleFlow)
	}
	dst, ep := s.Dst.Unmap(), s.Endpoint.Unmap()
	switch {
	case dst.IsValid() && ep.IsValid() && dst.Is4() != ep.Is4():
		return nil, fmt.Errorf("%w: destination %s and endpoint %s differ in family", ErrInvalidStaleFlow, dst, ep)
	case dst.IsValid():
		return []servicelb.Family{servicelb.FamilyOf(dst)}, nil
	case ep.IsValid():
		return []servicelb.Family{servicelb.FamilyOf(ep)}, nil
	}
	return []servicelb.Family{servicelb.IPv4, servicelb.IPv6}, nil
}
