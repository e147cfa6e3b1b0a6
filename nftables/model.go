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
	node nodePlan
	// cfg is the node the ports are planned for; it never changes (a
	// node change replaces it).
	cfg   *servicelb.NodeConfig
	ports map[servicelb.ServicePortKey]*portPlan
	// refs counts the ports that need each shared element.
	refs refCounts
	// shared counts the ports whose frontends are in each shape and
	// bucket set: the sets, and the shared chains' rules that read them,
	// exist while some port needs them.
	shared map[setID]int
	slots  *slotTable
}

func newModel() *model {
	return &model{ports: map[servicelb.ServicePortKey]*portPlan{}, refs: newRefCounts(), shared: map[setID]int{}, slots: newSlotTable()}
}

// build plans a whole State from scratch.
func (p *planner) build(st *servicelb.State) (*model, error) {
	m := newModel()
	node := st.Node()
	m.cfg = &node
	np, err := p.node(m.cfg)
	if err != nil {
		return nil, err
	}
	m.node = np
	txn := m.slots.begin()
	ports := st.Ports()
	m.ports = make(map[servicelb.ServicePortKey]*portPlan, len(ports))
	plans := make([]portPlan, len(ports))
	for i, sp := range ports {
		pp, err := p.port(sp, m.cfg, txn, nil)
		if err != nil {
			return nil, err
		}
		plans[i] = pp
		m.ports[sp.Key] = &plans[i]
		eachRef(sp, func(r ref) { m.refs.inc(r.key()) })
		for _, s := range pp.shared {
			m.shared[s]++
		}
	}
	txn.commit()
	return m, nil
}

// step is a planned change of a model: the ports it replaces and the
// counts it moves. apply commits it to the model after a successful sync.
type step struct {
	p       *planner
	node    *nodePlan             // the new node plan, when the node changed
	cfg     *servicelb.NodeConfig // the node the new ports are planned for
	removed []*portPlan
	added   []*portPlan
	changed []portChange
	slots   *slotTxn
	refs    map[refKey]int32 // new counts of the shared elements that moved
	shared  map[setID]int    // new counts of the shared sets that moved
}

// portChange is a port planned again.
type portChange struct {
	old, cur *portPlan
}

// plan computes the step from m (the model of from) to to. When the node
// changed every port is planned again; otherwise only the ports Diff
// reports.
func (p *planner) plan(m *model, ch *servicelb.Changes, to *servicelb.State) (*step, error) {
	node := to.Node()
	s := &step{p: p, cfg: &node, slots: m.slots.begin(), refs: map[refKey]int32{}, shared: map[setID]int{}}
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
		s.cfg = m.cfg
		for _, o := range ch.Removed {
			s.removed = append(s.removed, m.ports[o.Key])
		}
		targets = make([]*servicelb.ServicePort, 0, len(ch.Added)+len(ch.Changed))
		targets = append(targets, ch.Added...)
		for _, c := range ch.Changed {
			targets = append(targets, c.New)
		}
	}
	for _, old := range s.removed {
		s.release(old, [2]bool{})
	}
	for _, sp := range targets {
		old := m.ports[sp.Key]
		pp, err := p.port(sp, s.cfg, s.slots, old)
		if err != nil {
			return nil, err
		}
		if old == nil {
			s.added = append(s.added, &pp)
			continue
		}
		if pp.sp.Affinity > 0 {
			s.release(old, pp.uses)
		} else {
			s.release(old, [2]bool{})
		}
		s.changed = append(s.changed, portChange{old: old, cur: &pp})
	}
	s.count(m)
	return s, nil
}

// release frees the slots of old that the port no longer uses (keeps,
// when it still has affinity). Only a port with affinity holds slots.
func (s *step) release(old *portPlan, keeps [2]bool) {
	if old.sp.Affinity == 0 {
		return
	}
	for i, used := range old.uses {
		if used && !keeps[i] {
			s.slots.release(old.sp.Family, old.slot[i])
		}
	}
}

// count works out the new counts of the shared elements and shards that
// the step moves. A changed port moves only the elements it gained or
// lost: a port's refs come sorted (eachRef), so the two lists merge.
func (s *step) count(m *model) {
	moveRef := func(r ref, d int32) {
		k := r.key()
		n, ok := s.refs[k]
		if !ok {
			n = m.refs.get(k)
		}
		s.refs[k] = n + d
	}
	moveShared := func(pp *portPlan, d int) {
		for _, x := range pp.shared {
			if _, ok := s.shared[x]; !ok {
				s.shared[x] = m.shared[x]
			}
			s.shared[x] += d
		}
	}
	move := func(pp *portPlan, d int) {
		eachRef(pp.sp, func(r ref) { moveRef(r, int32(d)) })
		moveShared(pp, d)
	}
	for _, pp := range s.removed {
		move(pp, -1)
	}
	for _, pp := range s.added {
		move(pp, 1)
	}
	for _, c := range s.changed {
		old, cur := refsOf(c.old.sp), refsOf(c.cur.sp)
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
		if !slices.Equal(c.old.shared, c.cur.shared) {
			moveShared(c.old, -1)
			moveShared(c.cur, 1)
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
		m.node, m.cfg = *s.node, s.cfg
	}
	for _, pp := range s.removed {
		delete(m.ports, pp.sp.Key)
	}
	for _, pp := range s.added {
		m.ports[pp.sp.Key] = pp
	}
	for _, c := range s.changed {
		m.ports[c.cur.sp.Key] = c.cur
	}
	for r, n := range s.refs {
		m.refs.put(r, n)
	}
	for x, n := range s.shared {
		if n > 0 {
			m.shared[x] = n
		} else {
			delete(m.shared, x)
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

// content is a whole table, in the order it is declared and created: sets
// first, then chains. Each set's elements come in an order the kernel
// accepts: every owner's intervals in ascending order. A verify and Render
// make it; a write streams the same table into its batch without holding
// it whole (planner.write).
type content struct {
	sets []setDef
	// elems holds each set's elements as the parts their owners hold
	// (the node, each port, the shared elements).
	elems  map[setID][]elemPart
	chains []chainPlan
	// owners holds the owner of each chain of chains, by index: the key
	// of its service port, or nil for the node's.
	owners []any
}

// elemPart is the elements of one set that one owner holds: a service
// port (its key), or nil for the node and the elements ports share. A
// batch that writes them says whose they are (nfnl.Batch.SetOwner), so
// that a refusal of the kernel is traced to its service port.
type elemPart struct {
	owner any
	es    []elem
}

// setDefs returns the definitions of the model's sets: the fixed ones,
// then the shape and bucket sets its ports are in.
func (p *planner) setDefs(m *model) []setDef {
	var defs []setDef
	for _, f := range families {
		defs = append(defs, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shared)) {
		defs = append(defs, dynamicDef(p.table, s))
	}
	return defs
}

func (p *planner) content(m *model) *content {
	c := &content{elems: map[setID][]elemPart{}, sets: p.setDefs(m)}
	for set, es := range m.node.elems {
		c.add(set, nil, es)
	}
	c.chains = append(c.chains, p.nodeChains(m)...)
	c.owners = make([]any, len(c.chains), len(c.chains)+3*len(m.ports))
	for _, pp := range m.sortedPorts() {
		var owner any = pp.sp.Key
		fr := p.fragment(pp, m.cfg)
		for _, x := range fr.elems {
			c.add(x.set, owner, x.es)
		}
		c.chains = append(c.chains, fr.chains...)
		for range fr.chains {
			c.owners = append(c.owners, owner)
		}
	}
	refs := map[setID][]elem{}
	for k := range m.refs.all() {
		r := k.ref()
		refs[r.set] = append(refs[r.set], r.elem())
	}
	for set, es := range refs {
		c.add(set, nil, es)
	}
	return c
}

// add appends an owner's part of a set's elements.
func (c *content) add(set setID, owner any, es []elem) {
	if len(es) > 0 {
		c.elems[set] = append(c.elems[set], elemPart{owner: owner, es: es})
	}
}

// setElems returns a set's elements in one slice.
func (c *content) setElems(set setID) []elem {
	var out []elem
	for _, p := range c.elems[set] {
		out = append(out, p.es...)
	}
	return out
}
