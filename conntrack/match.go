package conntrack

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// portKey selects the stale-flow filters that can match a flow by its
// protocol and original destination port.
type portKey struct {
	proto uint8
	port  uint16
}

// index holds the stale-flow filters of one family so that a flow is
// matched with two map lookups and a search of the frontend's serving
// endpoints, whatever the number of filters: by protocol and port, then by
// destination. Filters of one frontend are merged: a flow stays when any
// of them keeps it.
type index map[portKey]map[netip.Addr]*servicelb.StaleFlow

func (ix index) add(s servicelb.StaleFlow) {
	k := portKey{s.Protocol.Number(), s.Port}
	dsts := ix[k]
	if dsts == nil {
		dsts = map[netip.Addr]*servicelb.StaleFlow{}
		ix[k] = dsts
	}
	dst := s.Dst.Unmap()
	serving := make([]netip.AddrPort, 0, len(s.Serving))
	for _, a := range s.Serving {
		serving = append(serving, netip.AddrPortFrom(a.Addr().Unmap(), a.Port()))
	}
	if d := dsts[dst]; d != nil {
		serving = append(serving, d.Serving...)
	}
	slices.SortFunc(serving, netip.AddrPort.Compare)
	s.Dst, s.Serving = dst, slices.Compact(serving)
	dsts[dst] = &s
}

// matches reports whether a filter selects a flow given by its protocol,
// original destination and reply source.
func (ix index) matches(proto uint8, dst netip.AddrPort, replySrc netip.AddrPort) bool {
	d := ix[portKey{proto, dst.Port()}][dst.Addr()]
	return d != nil && !d.Keeps(replySrc)
}

// buildIndex validates stale-flow filters and indexes them by family.
// Nothing is indexed if any filter is invalid.
func buildIndex(stale []servicelb.StaleFlow) (map[servicelb.Family]index, error) {
	out := map[servicelb.Family]index{}
	for i, s := range stale {
		f, err := family(s)
		if err != nil {
			return nil, &StaleFlowError{Index: i, Flow: s, Err: err}
		}
		if out[f] == nil {
			out[f] = index{}
		}
		out[f].add(s)
	}
	return out, nil
}

// family validates a filter and returns its family.
func family(s servicelb.StaleFlow) (servicelb.Family, error) {
	dst := s.Dst.Unmap()
	switch {
	case s.Protocol.Number() == 0:
		return 0, fmt.Errorf("%w: unknown protocol %q", ErrInvalidStaleFlow, s.Protocol)
	case s.Port == 0:
		return 0, fmt.Errorf("%w: port 0", ErrInvalidStaleFlow)
	case !dst.IsValid():
		return 0, fmt.Errorf("%w: no destination", ErrInvalidStaleFlow)
	case s.Dst.Zone() != "":
		return 0, fmt.Errorf("%w: zoned address", ErrInvalidStaleFlow)
	}
	for _, ap := range s.Serving {
		if a := ap.Addr().Unmap(); !a.IsValid() || a.Is4() != dst.Is4() || a.Zone() != "" || ap.Port() == 0 {
			return 0, fmt.Errorf("%w: serving endpoint %s does not fit destination %s", ErrInvalidStaleFlow, ap, dst)
		}
	}
	if !slices.IsSortedFunc(s.Serving, netip.AddrPort.Compare) {
		return 0, fmt.Errorf("%w: serving endpoints not sorted", ErrInvalidStaleFlow)
	}
	return servicelb.FamilyOf(dst), nil
}
