package servicelb

import (
	"net/netip"
	"reflect"
	"unique"
)

// A State holds each endpoint of its services once, as an epRec: 48 bytes
// where an Endpoint takes 152, most of them pointers and slices that an
// endpoint seldom uses. The node and zone names are interned
// (unique.Handle: one copy of each name in the process, freed when no
// State names it any more), the conditions and the weight are bits, and
// what is rare (named ports, hints, an address with a zone) sits in an
// epMore beside it. A State gives its services back as they were given
// (State.Service decodes them), and compiles and compares them from this
// form.
type epRec struct {
	addr   [16]byte
	node   unique.Handle[string]
	zone   unique.Handle[string]
	more   *epMore
	weight uint16
	flags  epFlags
}

// epMore is what few endpoints have: Ports, Hints, or an address with a
// zone (addr, then valid).
type epMore struct {
	ports map[string]uint16
	hints Hints
	addr  netip.Addr
}

type epFlags uint16

const (
	epIPv4 epFlags = 1 << iota
	epOnlyNamedPorts
	epReadySet // Ready is not nil; epReady is its value
	epReady
	epServingSet // Serving is not nil; epServing is its value
	epServing
	epTerminating
	epWeightSet // Weight is not nil; weight is its value
)

// intern returns s's handle; the zero handle for "".
func intern(s string) unique.Handle[string] {
	if s == "" {
		return unique.Handle[string]{}
	}
	return unique.Make(s)
}

func unintern(h unique.Handle[string]) string {
	if h == (unique.Handle[string]{}) {
		return ""
	}
	return h.Value()
}

// encodeEndpoints returns the compact form of eps; nil for none.
func encodeEndpoints(eps []Endpoint) []epRec {
	if len(eps) == 0 {
		return nil
	}
	out := make([]epRec, len(eps))
	for i := range eps {
		out[i] = encodeEndpoint(&eps[i])
	}
	return out
}

func encodeEndpoint(e *Endpoint) epRec {
	r := epRec{addr: e.Addr.As16(), node: intern(e.NodeName), zone: intern(e.Zone)}
	if e.Addr.Is4() {
		r.flags |= epIPv4
	}
	set := func(b epFlags, on bool) {
		if on {
			r.flags |= b
		}
	}
	set(epOnlyNamedPorts, e.OnlyNamedPorts)
	set(epTerminating, e.Terminating)
	if e.Ready != nil {
		set(epReadySet, true)
		set(epReady, *e.Ready)
	}
	if e.Serving != nil {
		set(epServingSet, true)
		set(epServing, *e.Serving)
	}
	if e.Weight != nil {
		set(epWeightSet, true)
		r.weight = *e.Weight
	}
	if e.Ports != nil || e.Hints.ForZones != nil || e.Hints.ForNodes != nil || e.Addr.Zone() != "" {
		r.more = &epMore{ports: e.Ports, hints: e.Hints}
		if e.Addr.Zone() != "" {
			r.more.addr = e.Addr
		}
	}
	return r
}

// decodeEndpoints returns the endpoints rs hold; nil for none.
func decodeEndpoints(rs []epRec) []Endpoint {
	if len(rs) == 0 {
		return nil
	}
	out := make([]Endpoint, len(rs))
	for i := range rs {
		out[i] = rs[i].endpoint()
	}
	return out
}

func (r *epRec) endpoint() Endpoint {
	e := Endpoint{Addr: r.address(), NodeName: unintern(r.node), Zone: unintern(r.zone),
		OnlyNamedPorts: r.has(epOnlyNamedPorts), Terminating: r.has(epTerminating)}
	if r.has(epReadySet) {
		e.Ready = new(r.has(epReady))
	}
	if r.has(epServingSet) {
		e.Serving = new(r.has(epServing))
	}
	if r.has(epWeightSet) {
		e.Weight = Weight(r.weight)
	}
	if r.more != nil {
		e.Ports, e.Hints = r.more.ports, r.more.hints
	}
	return e
}

func (r *epRec) has(b epFlags) bool { return r.flags&b != 0 }

func (r *epRec) address() netip.Addr {
	switch {
	case r.more != nil && r.more.addr.IsValid():
		return r.more.addr
	case r.has(epIPv4):
		return netip.AddrFrom16(r.addr).Unmap()
	}
	return netip.AddrFrom16(r.addr)
}

func (r *epRec) family() Family {
	if r.has(epIPv4) {
		return IPv4
	}
	return IPv6
}

// equal reports whether r and o hold the same endpoint.
func (r *epRec) equal(o *epRec) bool {
	a, b := *r, *o
	a.more, b.more = nil, nil
	return a == b && (r.more == o.more || (r.more != nil && o.more != nil && reflect.DeepEqual(*r.more, *o.more)))
}

func endpointsEqual(a, b []epRec) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].equal(&b[i]) {
			return false
		}
	}
	return true
}
