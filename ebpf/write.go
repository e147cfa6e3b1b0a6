//go:build linux

package ebpf

import (
	"maps"
)

// ops are the writes of one map in one phase.
type ops[K comparable, V any] struct {
	put map[K]V
	del []K
}

func (o *ops[K, V]) set(k K, v V) {
	if o.put == nil {
		o.put = map[K]V{}
	}
	o.put[k] = v
}

func (o *ops[K, V]) len() int { return len(o.put) + len(o.del) }

// delta is a change of the maps, in the order that keeps every lookup of
// the hooks whole: an endpoint's membership goes before its slots; slots
// are written before the count that makes them reachable, and deleted
// after the count that makes them unreachable; a set is complete before
// a frontend points to it, and a frontend no longer points to a set when
// the set goes.
type delta struct {
	// Phase 1: memberships of endpoints that went, then new memberships
	// and slots.
	memberGone []memberKey
	members    ops[memberKey, uint32]
	slots      ops[slotKey, endpoint]
	// Phase 2: sets (their counts and timeouts) and names.
	sets  ops[uint32, setVal]
	names ops[uint32, nameVal]
	// Phase 3: frontends written, then deleted.
	fe ops[feKey, feVal]
	// Phase 4: sets, names, slots and memberships that went.
	setGone    []uint32
	slotGone   []slotKey
	memberDrop []memberKey
	cfg        *cfgVal
}

func (d *delta) len() int {
	n := len(d.memberGone) + d.members.len() + d.slots.len() + d.sets.len() + d.names.len() + d.fe.len() +
		len(d.setGone) + len(d.slotGone) + len(d.memberDrop)
	if d.cfg != nil {
		n++
	}
	return n
}

// diffContent returns the writes that turn from into to.
func diffContent(from, to *content) *delta {
	d := &delta{}
	for k := range from.members {
		if _, ok := to.members[k]; !ok {
			if _, setStays := to.sets[k.Set]; setStays {
				d.memberGone = append(d.memberGone, k)
			} else {
				d.memberDrop = append(d.memberDrop, k)
			}
		}
	}
	diffMap(from.members, to.members, &d.members, nil)
	diffMap(from.slots, to.slots, &d.slots, &d.slotGone)
	diffMap(from.sets, to.sets, &d.sets, &d.setGone)
	diffMap(from.names, to.names, &d.names, &d.names.del)
	diffMap(from.fe, to.fe, &d.fe, &d.fe.del)
	if from.cfg != to.cfg {
		c := to.cfg
		d.cfg = &c
	}
	return d
}

// diffMap records in o the entries of to that from lacks or holds
// otherwise, and in gone (when not nil) the keys of from that to lacks.
func diffMap[K comparable, V comparable](from, to map[K]V, o *ops[K, V], gone *[]K) {
	for k, v := range to {
		if old, ok := from[k]; !ok || old != v {
			o.set(k, v)
		}
	}
	if gone == nil {
		return
	}
	for k := range from {
		if _, ok := to[k]; !ok {
			*gone = append(*gone, k)
		}
	}
}

// diffPlans adds to d the writes that turn a port's entries from old into
// next (either may be nil): what diffContent gives for the two ports'
// contents, found set by set (slots compared by index), without building
// them, for a change costs what changed.
func diffPlans(d *delta, old, next *portPlan) {
	var olds, nexts [2]*setPlan
	if old != nil {
		olds = old.sets
		for _, f := range old.frontends {
			if next.index(f.key) < 0 {
				d.fe.del = append(d.fe.del, f.key)
			}
		}
	}
	if next != nil {
		nexts = next.sets
		for _, f := range next.frontends {
			if v, ok := old.frontend(f.key); !ok || v != f.val {
				d.fe.set(f.key, f.val)
			}
		}
	}
	for _, n := range nexts {
		if n != nil {
			diffSet(d, setByID(olds, n.id), n)
		}
	}
	for _, o := range olds {
		if o != nil && setByID(nexts, o.id) == nil {
			diffSet(d, o, nil)
		}
	}
}

func setByID(sets [2]*setPlan, id uint32) *setPlan {
	for _, s := range sets {
		if s != nil && s.id == id {
			return s
		}
	}
	return nil
}

// diffSet records the writes that turn set o into set n, which has the
// same id (o nil: the set is new; n nil: it goes).
func diffSet(d *delta, o, n *setPlan) {
	if n == nil {
		d.setGone = append(d.setGone, o.id)
		d.names.del = append(d.names.del, o.id)
		for i := range o.slots {
			d.slotGone = append(d.slotGone, slotKey{o.id, uint32(i)})
		}
		for e := range o.memberSet() {
			d.memberDrop = append(d.memberDrop, memberKey{Set: o.id, endpoint: e})
		}
		return
	}
	var was []endpoint
	if o == nil || o.value() != n.value() {
		d.sets.set(n.id, n.value())
	}
	if o == nil || (o.name != n.name && newName(o.name) != newName(n.name)) {
		d.names.set(n.id, newName(n.name))
	}
	if o != nil {
		was = o.slots
	}
	for i, e := range n.slots {
		if i >= len(was) || was[i] != e {
			d.slots.set(slotKey{n.id, uint32(i)}, e)
		}
	}
	for i := len(n.slots); i < len(was); i++ {
		d.slotGone = append(d.slotGone, slotKey{n.id, uint32(i)})
	}
	in, out := n.memberSet(), o.memberSet()
	for e := range in {
		if !out[e] {
			d.members.set(memberKey{Set: n.id, endpoint: e}, 1)
		}
	}
	for e := range out {
		if !in[e] {
			d.memberGone = append(d.memberGone, memberKey{Set: n.id, endpoint: e})
		}
	}
}

// sink receives a delta's writes: the maps, or a content standing in for
// them.
type sink interface {
	delMembers([]memberKey) error
	putMembers(map[memberKey]uint32) error
	putSlots(map[slotKey]endpoint) error
	putSets(map[uint32]setVal) error
	putNames(map[uint32]nameVal) error
	putCfg(cfgVal) error
	putFE(map[feKey]feVal) error
	delFE([]feKey) error
	delSets([]uint32) error
	delNames([]uint32) error
	delSlots([]slotKey) error
}

// run sends the delta's writes to s, in the order the delta's
// documentation gives, calling between (when set) after each step. It
// stops at the first error.
func (d *delta) run(s sink, between func()) error {
	steps := []func() error{
		func() error { return s.delMembers(d.memberGone) },
		func() error { return s.putMembers(d.members.put) },
		func() error { return s.putSlots(d.slots.put) },
		func() error { return s.putSets(d.sets.put) },
		func() error { return s.putNames(d.names.put) },
		func() error {
			if d.cfg == nil {
				return nil
			}
			return s.putCfg(*d.cfg)
		},
		func() error { return s.putFE(d.fe.put) },
		func() error { return s.delFE(d.fe.del) },
		func() error { return s.delSets(d.setGone) },
		func() error { return s.delNames(d.names.del) },
		func() error { return s.delSlots(d.slotGone) },
		func() error { return s.delMembers(d.memberDrop) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
		if between != nil {
			between()
		}
	}
	return nil
}

func delKeys[K comparable, V any](m map[K]V, keys []K) error {
	for _, k := range keys {
		delete(m, k)
	}
	return nil
}

func putAll[K comparable, V any](m map[K]V, from map[K]V) error {
	maps.Copy(m, from)
	return nil
}

func (c *content) delMembers(k []memberKey) error          { return delKeys(c.members, k) }
func (c *content) putMembers(m map[memberKey]uint32) error { return putAll(c.members, m) }
func (c *content) putSlots(m map[slotKey]endpoint) error   { return putAll(c.slots, m) }
func (c *content) putSets(m map[uint32]setVal) error       { return putAll(c.sets, m) }
func (c *content) putNames(m map[uint32]nameVal) error     { return putAll(c.names, m) }
func (c *content) putCfg(v cfgVal) error                   { c.cfg = v; return nil }
func (c *content) putFE(m map[feKey]feVal) error           { return putAll(c.fe, m) }
func (c *content) delFE(k []feKey) error                   { return delKeys(c.fe, k) }
func (c *content) delSets(k []uint32) error                { return delKeys(c.sets, k) }
func (c *content) delNames(k []uint32) error               { return delKeys(c.names, k) }
func (c *content) delSlots(k []slotKey) error              { return delKeys(c.slots, k) }
