//go:build linux

package ipvs

import (
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// step is how the model changes with a servicelb.Changes, computed
// without changing the plan: the ports it drops, the ports it plans anew
// (the added and changed ones, and those whose marks moved), and the
// marks after it (nil units when they stay as they are).
type step struct {
	drop  []servicelb.ServicePortKey
	put   []*portPlan
	units map[markUnit]servicelb.ServicePortKey
	marks map[markUnit]uint32
}

// step plans the ports that changed. It fails, changing nothing, when a
// port cannot be planned.
func (p *model) plan(ch *servicelb.Changes) (*step, error) {
	s := &step{}
	leaving := map[servicelb.ServicePortKey]bool{}
	for _, sp := range ch.Removed {
		leaving[sp.Key] = true
	}
	var errs []error
	for _, sp := range slices.Concat(ch.Added, newPorts(ch.Changed)) {
		pp, err := planPort(&p.env, sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.put = append(s.put, pp)
		leaving[sp.Key] = true
	}
	if err := joinErrs(errs); err != nil {
		return nil, err
	}
	marks := p.marks
	if units, changed := p.nextUnits(leaving, s.put); changed {
		var err error
		if marks, err = p.env.space.allocate(slices.Collect(maps.Keys(units))); err != nil {
			return nil, err
		}
		s.units, s.marks = units, marks
		s.put = append(s.put, p.remarked(leaving, units, marks)...)
	}
	claimed := map[vsKey]servicelb.ServicePortKey{}
	for _, pp := range s.put {
		pp.realize(&p.env, marks)
		if err := p.checkFree(pp, leaving); err != nil {
			return nil, err
		}
		for _, vs := range pp.allServers() {
			if o, ok := claimed[vs.key()]; ok {
				return nil, conflict(vs.key(), pp.key(), o)
			}
			claimed[vs.key()] = pp.key()
		}
	}
	s.drop = slices.SortedFunc(maps.Keys(leaving), servicelb.ServicePortKey.Compare)
	return s, nil
}

// nextUnits returns the marks needed once the leaving ports are replaced
// by put, and whether they differ from the plan's.
func (p *model) nextUnits(leaving map[servicelb.ServicePortKey]bool, put []*portPlan) (map[markUnit]servicelb.ServicePortKey, bool) {
	var before, after []markUnit
	for k := range leaving {
		if pp := p.ports[k]; pp != nil {
			before = append(before, pp.units...)
		}
	}
	for _, pp := range put {
		after = append(after, pp.units...)
	}
	slices.SortFunc(before, compareUnits)
	slices.SortFunc(after, compareUnits)
	if slices.Equal(before, after) {
		return p.units, false
	}
	units := maps.Clone(p.units)
	for _, u := range before {
		delete(units, u)
	}
	for _, pp := range put {
		for _, u := range pp.units {
			units[u] = pp.key()
		}
	}
	return units, true
}

// remarked returns new plans for the ports that stay but whose marks
// moved, and counts them as leaving.
func (p *model) remarked(leaving map[servicelb.ServicePortKey]bool, units map[markUnit]servicelb.ServicePortKey, marks map[markUnit]uint32) []*portPlan {
	moved := map[servicelb.ServicePortKey]bool{}
	for u, m := range marks {
		if old, ok := p.marks[u]; ok && old != m && !leaving[units[u]] {
			moved[units[u]] = true
		}
	}
	var out []*portPlan
	for _, k := range slices.SortedFunc(maps.Keys(moved), servicelb.ServicePortKey.Compare) {
		pp := *p.ports[k]
		out = append(out, &pp)
		leaving[k] = true
	}
	return out
}

// commit makes the plan the one after the step.
func (p *model) commit(s *step) {
	for _, k := range s.drop {
		p.remove(k)
	}
	for _, pp := range s.put {
		p.add(pp)
	}
	if s.units != nil {
		p.units, p.marks = s.units, s.marks
	}
}

func newPorts(cs []servicelb.PortChange) []*servicelb.ServicePort {
	out := make([]*servicelb.ServicePort, len(cs))
	for i, c := range cs {
		out[i] = c.New
	}
	return out
}

// ruleSlot names the rules of one port in one keyed chain: FROM-POD
// (chain 0) or FROM-NODE (chain 1) of a family.
type ruleSlot struct {
	family servicelb.Family
	chain  int
	key    string
}

// originChain returns the index of the chain of an origin's steers.
func originChain(o servicelb.Origin) int {
	if o == servicelb.FromPod {
		return 0
	}
	return 1
}

// delta is a change to the kernel: the virtual servers to make match their
// plan (nil meaning delete), the set entries to add and delete, and the
// rules of ports in the keyed chains to replace (none meaning remove).
type delta struct {
	servers  map[vsKey]*VirtualServer
	add, del []setEntry
	rules    map[ruleSlot][]xtables.Rule
	// full makes the kernel match a whole plan: every address and rule
	// not wanted goes.
	full bool
	// read is set when the kernel's virtual servers were just read, so
	// that every foreign one is known.
	read bool
	// owner names the service port each virtual server added serves.
	owner map[vsKey]servicelb.ServicePortKey
}

// delta returns what the kernel must change for a step of the plan,
// before the step is committed.
func (p *model) delta(s *step) *delta {
	d := &delta{servers: map[vsKey]*VirtualServer{}, rules: map[ruleSlot][]xtables.Rule{},
		owner: map[vsKey]servicelb.ServicePortKey{}}
	counts := map[setEntry]int{}
	slot := func(pp *portPlan, i int) ruleSlot { return ruleSlot{pp.sp.Family, i, pp.key().String()} }
	for _, k := range s.drop {
		pp := p.ports[k]
		if pp == nil {
			continue
		}
		for _, vs := range pp.allServers() {
			d.servers[vs.key()] = nil
		}
		for _, e := range pp.entries {
			counts[e]--
		}
		for i, rs := range pp.rules {
			if len(rs) > 0 {
				d.rules[slot(pp, i)] = nil
			}
		}
	}
	for _, pp := range s.put {
		for _, vs := range pp.allServers() {
			d.servers[vs.key()] = vs
			d.owner[vs.key()] = pp.key()
		}
		for _, e := range pp.entries {
			counts[e]++
		}
		for i, rs := range pp.rules {
			if _, gone := d.rules[slot(pp, i)]; gone || len(rs) > 0 {
				d.rules[slot(pp, i)] = rs
			}
		}
	}
	for e, c := range counts {
		switch before, after := p.entries[e], p.entries[e]+c; {
		case before == 0 && after > 0:
			d.add = append(d.add, e)
		case before > 0 && after == 0:
			d.del = append(d.del, e)
		}
	}
	slices.SortFunc(d.add, compareEntries)
	slices.SortFunc(d.del, compareEntries)
	return d
}
