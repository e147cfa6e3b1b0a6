//go:build linux

package nftables

import (
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// model is the plan of a whole State: what the table holds once the State
// is applied. The Proxier keeps the model of the state it applied last and
// changes it only after a successful commit.
type model struct {
	node  nodePlan
	ports map[servicelb.ServicePortKey]*portPlan
	// refs counts the ports that need each shared element.
	refs map[ref]int
	// shards counts the load-balancing chains reading each backends map.
	shards map[setID]int
	slots  *slotTable
}

func newModel() *model {
	return &model{ports: map[servicelb.ServicePortKey]*portPlan{}, refs: map[ref]int{}, shards: map[setID]int{}, slots: newSlotTable()}
}

// build plans a whole State from scratch.
func (p *planner) build(st *servicelb.State) (*model, error) {
	m := newModel()
	node := st.Node()
	np, err := p.node(&node)
	if err != nil {
		return nil, err
	}
	m.node = np
	txn := m.slots.begin()
	ports := st.Ports()
	m.ports = make(map[servicelb.ServicePortKey]*portPlan, len(ports))
	for _, sp := range ports {
		pp, err := p.port(sp, &node, txn)
		if err != nil {
			return nil, err
		}
		m.ports[sp.Key] = pp
		for _, r := range pp.refs {
			m.refs[r]++
		}
		for _, s := range pp.shards {
			m.shards[s]++
		}
	}
	txn.commit()
	return m, nil
}

// step is a planned change of a model: the fragments it replaces and the
// counts it moves. apply commits it to the model after a successful sync.
type step struct {
	node    *nodePlan // the new node plan, when the node changed
	removed []*portPlan
	added   []*portPlan
	changed [][2]*portPlan // old, new
	slots   *slotTxn
	refs    map[ref]int   // new counts of the shared elements that moved
	shards  map[setID]int // new counts of the maps that moved
}

// plan computes the step from m (the model of from) to to. When the node
// changed every port is planned again; otherwise only the ports Diff
// reports.
func (p *planner) plan(m *model, ch *servicelb.Changes, to *servicelb.State) (*step, error) {
	node := to.Node()
	s := &step{slots: m.slots.begin(), refs: map[ref]int{}, shards: map[setID]int{}}
	var targets []*servicelb.ServicePort
	if ch.NodeChanged {
		np, err := p.node(&node)
		if err != nil {
			return nil, err
		}
		s.node = &np
		targets = to.Ports()
		for k, old := range m.ports {
			if to.Port(k) == nil {
				s.removed = append(s.removed, old)
			}
		}
	} else {
		for _, o := range ch.Removed {
			s.removed = append(s.removed, m.ports[o.Key])
		}
		targets = slices.Clone(ch.Added)
		for _, c := range ch.Changed {
			if old := m.ports[c.New.Key]; old != nil && c.EndpointsOnly() {
				pp, ok, err := p.endpoints(old, c.New, s.slots)
				if err != nil {
					return nil, err
				}
				if ok {
					s.changed = append(s.changed, [2]*portPlan{old, pp})
					continue
				}
			}
			targets = append(targets, c.New)
		}
	}
	for _, old := range s.removed {
		for _, k := range old.slots {
			s.slots.release(k)
		}
	}
	for _, sp := range targets {
		pp, err := p.port(sp, &node, s.slots)
		if err != nil {
			return nil, err
		}
		if old := m.ports[sp.Key]; old != nil {
			s.changed = append(s.changed, [2]*portPlan{old, pp})
			for _, k := range old.slots {
				if !slices.Contains(pp.slots, k) {
					s.slots.release(k)
				}
			}
		} else {
			s.added = append(s.added, pp)
		}
	}
	s.count(m)
	return s, nil
}

// count works out the new counts of the shared elements and shards that
// the step moves. A changed port moves only the elements it gained or
// lost: a port's refs are sorted (refsOf), so the two lists merge.
func (s *step) count(m *model) {
	moveRef := func(r ref, d int) {
		n, ok := s.refs[r]
		if !ok {
			n = m.refs[r]
		}
		s.refs[r] = n + d
	}
	move := func(pp *portPlan, d int) {
		for _, r := range pp.refs {
			moveRef(r, d)
		}
		for _, x := range pp.shards {
			if _, ok := s.shards[x]; !ok {
				s.shards[x] = m.shards[x]
			}
			s.shards[x] += d
		}
	}
	for _, pp := range s.removed {
		move(pp, -1)
	}
	for _, pp := range s.added {
		move(pp, 1)
	}
	for _, c := range s.changed {
		old, cur := c[0].refs, c[1].refs
		for len(old) > 0 || len(cur) > 0 {
			switch d := cmpFirst(old, cur); {
			case d < 0:
				moveRef(old[0], -1)
				old = old[1:]
			case d > 0:
				moveRef(cur[0], 1)
				cur = cur[1:]
			default:
				old, cur = old[1:], cur[1:]
			}
		}
		if !slices.Equal(c[0].shards, c[1].shards) {
			move(&portPlan{shards: c[0].shards}, -1)
			move(&portPlan{shards: c[1].shards}, 1)
		}
	}
}

// cmpFirst compares the first refs of two sorted lists, an empty list's
// coming last.
func cmpFirst(a, b []ref) int {
	switch {
	case len(a) == 0:
		return 1
	case len(b) == 0:
		return -1
	}
	return compareRefs(a[0], b[0])
}

// apply makes m the model of the step's target state.
func (s *step) apply(m *model) {
	if s.node != nil {
		m.node = *s.node
	}
	for _, pp := range s.removed {
		delete(m.ports, pp.key)
	}
	for _, pp := range s.added {
		m.ports[pp.key] = pp
	}
	for _, c := range s.changed {
		m.ports[c[1].key] = c[1]
	}
	for r, n := range s.refs {
		if n > 0 {
			m.refs[r] = n
		} else {
			delete(m.refs, r)
		}
	}
	for x, n := range s.shards {
		if n > 0 {
			m.shards[x] = n
		} else {
			delete(m.shards, x)
		}
	}
	s.slots.commit()
}

// sortedPorts returns a model's port plans in key order.
func (m *model) sortedPorts() []*portPlan {
	keys := slices.SortedFunc(maps.Keys(m.ports), servicelb.ServicePortKey.Compare)
	out := make([]*portPlan, len(keys))
	for i, k := range keys {
		out[i] = m.ports[k]
	}
	return out
}
