//go:build linux

package ipvs

import (
	"net/netip"
	"slices"
	"time"
)

// mirror is what the Proxier knows the kernel holds of its own, kept up
// to date request by request as the kernel takes them (see
// Proxier.write): the kernel is not transactional, so that after a
// partial failure the mirror, not the plan, says what the next sync
// starts from.
type mirror struct {
	// servers are the proxier's virtual servers as the kernel holds
	// them, draining real servers (weight 0) included; nil until the
	// kernel is read.
	servers map[vsKey]*VirtualServer
	// present are the addresses on the dummy link; use counts the
	// virtual servers of servers on each.
	present map[netip.Addr]bool
	use     map[netip.Addr]int
	// stray are prefixes on the dummy link that are not single
	// addresses: never the proxier's, removed by the next full sync.
	stray []netip.Prefix
	// draining are the removed real servers left at weight 0 until
	// their connections end, with when each began to drain. They outlive
	// a new read of the kernel, so that a drain's graceful timeout counts
	// from its start.
	draining map[realKey]time.Time
}

func newMirror() mirror { return mirror{draining: map[realKey]time.Time{}} }

// read starts the mirror again from the prefixes on the dummy link, for
// the virtual servers found in the kernel to be adopted; the drains stay.
func (m *mirror) read(prefixes []netip.Prefix) {
	m.servers, m.present, m.use, m.stray = map[vsKey]*VirtualServer{}, map[netip.Addr]bool{}, map[netip.Addr]int{}, nil
	for _, pf := range prefixes {
		if pf.IsSingleIP() {
			m.present[pf.Addr()] = true
		} else {
			m.stray = append(m.stray, pf)
		}
	}
}

// forget forgets everything: the kernel is read again before the next
// write.
func (m *mirror) forget() {
	m.servers, m.present, m.use, m.stray = nil, nil, nil, nil
	clear(m.draining)
}

// adopt records a virtual server found in the kernel, with its real
// servers; one at weight 0 not yet known to drain drains from now.
func (m *mirror) adopt(vs *VirtualServer, now time.Time) {
	for _, r := range vs.Real {
		rk := realKey{vs.key(), r.AddrPort()}
		if _, ok := m.draining[rk]; r.Weight == 0 && !ok {
			m.draining[rk] = now
		}
	}
	m.servers[vs.key()] = vs
	if vs.FWMark == 0 {
		m.use[vs.Addr]++
	}
}

// dropStaleDrains forgets the drains of real servers that are gone or no
// longer at weight 0.
func (m *mirror) dropStaleDrains() {
	for rk := range m.draining {
		vs := m.servers[rk.vs]
		if vs == nil {
			delete(m.draining, rk)
			continue
		}
		if i := vs.realIndex(rk.ap); i < 0 || vs.Real[i].Weight != 0 {
			delete(m.draining, rk)
		}
	}
}

// startDrain records a real server at weight 0 as draining from now,
// unless it already is; it reports whether it began now.
func (m *mirror) startDrain(vs *VirtualServer, r RealServer, now time.Time) bool {
	rk := realKey{vs.key(), r.AddrPort()}
	if _, ok := m.draining[rk]; ok {
		return false
	}
	m.draining[rk] = now
	return true
}

// record updates the mirror after the kernel took o, at now; it reports
// whether a real server began to drain.
func (m *mirror) record(o ipvsOp, now time.Time) (drains bool) {
	k := o.vs.key()
	have := m.servers[k]
	switch o.kind {
	case newService:
		got := o.vs.clone()
		got.Real = nil
		m.servers[k] = got
		if k.fwmark == 0 {
			m.use[k.addr]++
		}
	case updateService:
		have.Scheduler, have.Persistence, have.HashPort = o.vs.Scheduler, o.vs.Persistence, o.vs.HashPort
	case delService:
		for _, r := range have.Real {
			delete(m.draining, realKey{k, r.AddrPort()})
		}
		delete(m.servers, k)
		if k.fwmark == 0 {
			m.use[k.addr]--
		}
	case newReal:
		i, _ := slices.BinarySearchFunc(have.Real, o.r, compareReal)
		have.Real = slices.Insert(have.Real, i, o.r)
		delete(m.draining, realKey{k, o.r.AddrPort()})
	case updateReal, quiesceReal:
		have.Real[have.realIndex(o.r.AddrPort())].Weight = o.r.Weight
		if o.kind == quiesceReal {
			return m.startDrain(have, o.r, now)
		}
		delete(m.draining, realKey{k, o.r.AddrPort()})
	case delReal:
		have.Real = slices.DeleteFunc(have.Real, func(x RealServer) bool { return x.AddrPort() == o.r.AddrPort() })
		delete(m.draining, realKey{k, o.r.AddrPort()})
	}
	return false
}
