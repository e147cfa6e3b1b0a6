//go:build linux

package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

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

// model is what a whole State asks of the kernel: the plan of each of
// its service ports. The Proxier keeps the one it applied.
type model struct {
	env     planEnv
	ports   map[servicelb.ServicePortKey]*portPlan
	servers map[vsKey]*VirtualServer
	owner   map[vsKey]servicelb.ServicePortKey
	// entries counts the ports that need each set entry.
	entries map[setEntry]int
	// units are the marks the ports need, with the port that needs each,
	// and marks their values.
	units map[markUnit]servicelb.ServicePortKey
	marks map[markUnit]uint32
}

func newModel(env planEnv) *model {
	return &model{env: env, ports: map[servicelb.ServicePortKey]*portPlan{},
		servers: map[vsKey]*VirtualServer{}, owner: map[vsKey]servicelb.ServicePortKey{},
		entries: map[setEntry]int{}, units: map[markUnit]servicelb.ServicePortKey{}, marks: map[markUnit]uint32{}}
}

// buildModel plans every service port of st. It fails, with every mistake
// joined, when a port asks for something the proxier cannot do.
func buildModel(st *servicelb.State, o *Options) (*model, error) {
	node := st.Node()
	env, err := newPlanEnv(&node, o)
	if err != nil {
		return nil, err
	}
	p := newModel(env)
	var pps []*portPlan
	var errs []error
	for _, sp := range st.Ports() {
		pp, err := planPort(&p.env, sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pps = append(pps, pp)
		for _, u := range pp.units {
			p.units[u] = pp.key()
		}
	}
	if err := joinErrs(errs); err != nil {
		return nil, err
	}
	if p.marks, err = env.space.allocate(slices.Collect(maps.Keys(p.units))); err != nil {
		return nil, err
	}
	for _, pp := range pps {
		pp.realize(&p.env, p.marks)
		if err := p.checkFree(pp, nil); err != nil {
			return nil, err
		}
		p.add(pp)
	}
	return p, nil
}

// checkFree refuses a port's plan that needs a virtual server another
// port keeps (one not leaving). servicelb gives each frontend to one
// port, so this only guards that promise.
func (p *model) checkFree(pp *portPlan, leaving map[servicelb.ServicePortKey]bool) error {
	for _, vs := range pp.allServers() {
		if o, ok := p.owner[vs.key()]; ok && o != pp.key() && !leaving[o] {
			return conflict(vs.key(), pp.key(), o)
		}
	}
	return nil
}

func conflict(k vsKey, a, b servicelb.ServicePortKey) error {
	return fmt.Errorf("%w: %s needed by %s and %s", ErrConflict, k, a, b)
}

// add records a port's plan.
func (p *model) add(pp *portPlan) {
	p.ports[pp.key()] = pp
	for _, vs := range pp.allServers() {
		p.servers[vs.key()] = vs
		p.owner[vs.key()] = pp.key()
	}
	for _, e := range pp.entries {
		p.entries[e]++
	}
}

// remove forgets a port's plan.
func (p *model) remove(k servicelb.ServicePortKey) {
	pp := p.ports[k]
	if pp == nil {
		return
	}
	for _, vs := range pp.allServers() {
		if p.owner[vs.key()] == k {
			delete(p.servers, vs.key())
			delete(p.owner, vs.key())
		}
	}
	for _, e := range pp.entries {
		if p.entries[e]--; p.entries[e] <= 0 {
			delete(p.entries, e)
		}
	}
	delete(p.ports, k)
}

// addresses returns the addresses the plan puts on the dummy link: those
// of its address virtual servers that are not node addresses, sorted.
func (p *model) addresses() []netip.Addr {
	set := map[netip.Addr]bool{}
	for k := range p.servers {
		if k.fwmark == 0 && !p.env.nodeIPs[k.addr] {
			set[k.addr] = true
		}
	}
	return slices.SortedFunc(maps.Keys(set), netip.Addr.Compare)
}

// joinErrs joins errors, returning a single one as it is.
func joinErrs(errs []error) error {
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}
