//go:build linux

package nftables

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// delta is the difference between two plans, in the order a batch must
// apply it: references go before what they refer to is deleted, and after
// what they refer to is created.
type delta struct {
	delElems map[setID][]elem
	addElems map[setID][]elem
	flush    []string    // chains whose rules are replaced or that go
	delete   []string    // chains that go
	create   []chainPlan // chains that are new
	write    []chainPlan // chains whose rules are written (new or changed)
	delSets  []setID
	addSets  []setID

	// Whose each part is, for the batch to say (nfnl.Batch.SetOwner):
	// the owner of each chain named above that a service port has, and
	// runs of owners of the elements, in order. owner is the one of what
	// is recorded now: a service port's key, or nil.
	chainOwner           map[string]any
	delOwners, addOwners map[setID][]ownerRun
	owner                any
}

// ownerRun makes a list's elements from index from on belong to owner.
type ownerRun struct {
	from  int
	owner any
}

// addElem records elements to add to set, as the current owner's.
func (d *delta) addElem(set setID, es ...elem) {
	d.addOwners[set] = run(d.addOwners[set], len(d.addElems[set]), d.owner)
	d.addElems[set] = append(d.addElems[set], es...)
}

// delElem records elements to delete from set, as the current owner's.
func (d *delta) delElem(set setID, es ...elem) {
	d.delOwners[set] = run(d.delOwners[set], len(d.delElems[set]), d.owner)
	d.delElems[set] = append(d.delElems[set], es...)
}

// run marks the elements of a list from index at on as owner's.
func run(runs []ownerRun, at int, owner any) []ownerRun {
	if n := len(runs); n > 0 && runs[n-1].owner == owner {
		return runs
	}
	return append(runs, ownerRun{from: at, owner: owner})
}

// ownChain records that a chain the delta names is the current owner's.
func (d *delta) ownChain(name string) {
	if d.owner != nil {
		d.chainOwner[name] = d.owner
	}
}

// objects reports whether the delta adds or deletes chains or sets, the
// objects the table's use count counts.
func (d *delta) objects() bool {
	return len(d.create) > 0 || len(d.delete) > 0 || len(d.addSets) > 0 || len(d.delSets) > 0
}

func newDelta() *delta {
	return &delta{delElems: map[setID][]elem{}, addElems: map[setID][]elem{},
		chainOwner: map[string]any{}, delOwners: map[setID][]ownerRun{}, addOwners: map[setID][]ownerRun{}}
}

func sameRules(a, b []*rule) bool {
	return slices.EqualFunc(a, b, func(x, y *rule) bool { return x == y || x.text == y.text })
}

func (d *delta) chains(old, cur []chainPlan) {
	prev := map[string]*chainPlan{}
	for i := range old {
		prev[old[i].name] = &old[i]
	}
	for _, c := range cur {
		o, ok := prev[c.name]
		switch {
		case !ok:
			d.create = append(d.create, c)
			d.write = append(d.write, c)
			d.ownChain(c.name)
		case !sameRules(o.rules, c.rules):
			d.flush = append(d.flush, c.name)
			d.write = append(d.write, c)
			d.ownChain(c.name)
		}
		delete(prev, c.name)
	}
	for _, c := range old {
		if _, ok := prev[c.name]; ok {
			d.flush = append(d.flush, c.name)
			d.delete = append(d.delete, c.name)
			d.ownChain(c.name)
		}
	}
}

func (d *delta) elems(set setID, old, cur []elem) {
	if set.interval() {
		d.intervals(set, old, cur)
		return
	}
	prev := make(map[string]*elem, len(old))
	for i := range old {
		prev[old[i].id()] = &old[i]
	}
	for i := range cur {
		id := cur[i].id()
		o, ok := prev[id]
		if ok && o.same(&cur[i]) {
			delete(prev, id)
			continue
		}
		d.addElem(set, cur[i])
	}
	for _, o := range prev {
		d.delElem(set, *o)
	}
}

// intervals diffs the elements of an interval set that one owner (a port,
// or the node) holds, interval by interval: an interval (a start element
// and the end element after it, if any) that stays with the same bounds
// and value stays in place; every other one goes whole and the new ones
// come whole, since the kernel refuses to split or stretch an interval
// that stays. So an endpoint replaced in place moves two elements of its
// slot out and two in, not the whole slot.
func (d *delta) intervals(set setID, old, cur []elem) {
	same := len(old) == len(cur)
	for i := 0; same && i < len(old); i++ {
		same = old[i].equal(&cur[i])
	}
	if same {
		return
	}
	was := make(map[string]bool, len(old)/2)
	eachInterval(old, func(iv []elem) { was[intervalID(iv)] = true })
	now := make(map[string]bool, len(cur)/2)
	eachInterval(cur, func(iv []elem) {
		id := intervalID(iv)
		now[id] = true
		if !was[id] {
			d.addElem(set, iv...)
		}
	})
	eachInterval(old, func(iv []elem) {
		if !now[intervalID(iv)] {
			d.delElem(set, iv...)
		}
	})
}

// eachInterval calls f for each interval of es, in order: a start element
// with the end element that follows it, or alone when none does.
func eachInterval(es []elem, f func(iv []elem)) {
	for i := 0; i < len(es); {
		n := 1
		if es[i].flags&nfnl.ElemIntervalEnd == 0 && i+1 < len(es) && es[i+1].flags&nfnl.ElemIntervalEnd != 0 {
			n = 2
		}
		f(es[i : i+n])
		i += n
	}
}

// intervalID identifies an interval with its value.
func intervalID(iv []elem) string {
	id := iv[0].id() + "\x00" + string(iv[0].data) + "\x00" + iv[0].chain
	if len(iv) > 1 {
		id += "\x00" + iv[1].id()
	}
	return id
}

// elemMaps diffs two maps of sets to elements.
func (d *delta) elemMaps(old, cur map[setID][]elem) {
	for set, es := range cur {
		d.elems(set, old[set], es)
	}
	for set, es := range old {
		if _, ok := cur[set]; !ok {
			d.elems(set, es, nil)
		}
	}
}

// port adds the difference between two fragments of one port (nil for a
// port that is new or gone), as the port's (owner, its key).
func (d *delta) port(owner any, old, cur *fragment) {
	d.owner = owner
	defer func() { d.owner = nil }()
	var oc, cc []chainPlan
	var oe, ce []setElems
	var ob, cb []slotRange
	if old != nil {
		oc, oe, ob = old.chains, old.elems, old.backends
	}
	if cur != nil {
		cc, ce, cb = cur.chains, cur.elems, cur.backends
	}
	d.chains(oc, cc)
	d.setElems(oe, ce)
	d.slots(ob, cb)
}

// setElems diffs a port's elements outside the backends maps.
func (d *delta) setElems(old, cur []setElems) {
	find := func(xs []setElems, set setID) []elem {
		for _, x := range xs {
			if x.set == set {
				return x.es
			}
		}
		return nil
	}
	for _, x := range cur {
		d.elems(x.set, find(old, x.set), x.es)
	}
	for _, x := range old {
		if find(cur, x.set) == nil {
			d.elems(x.set, x.es, nil)
		}
	}
}

// slots diffs the ranges of a port's load-balancing slots, slot by slot:
// a range that stays with the same bounds and endpoint stays in place.
func (d *delta) slots(old, cur []slotRange) {
	find := func(xs []slotRange, r *slotRange) *slotRange {
		for i := range xs {
			if xs[i].set == r.set && xs[i].slot == r.slot {
				return &xs[i]
			}
		}
		return nil
	}
	for i := range cur {
		d.slot(cur[i].set, cur[i].slot, find(old, &cur[i]), &cur[i])
	}
	for i := range old {
		if find(cur, &old[i]) == nil {
			d.slot(old[i].set, old[i].slot, &old[i], nil)
		}
	}
}

// slot adds the difference between two spreads of one slot (nil for
// none): its ranges in ascending order, merged by their first bucket. A
// range whose bounds stay and whose endpoint changes changes its start
// element alone, which holds the endpoint. The kernel refuses to split
// or stretch a range that stays, so a range whose bounds change goes
// whole and comes back whole.
func (d *delta) slot(set setID, slot uint32, old, cur *slotRange) {
	var o, c ranges
	if old != nil {
		o = rangesOf(old.bs)
	}
	if cur != nil {
		c = rangesOf(cur.bs)
	}
	base := slot * bucketStride
	// The slot's elements go out and in as two runs of one owner.
	var dels, adds []elem
	del := func(i int) { dels = o.appendElems(dels, base, i) }
	add := func(i int) { adds = c.appendElems(adds, base, i) }
	i, j := 0, 0
	for i < o.len() || j < c.len() {
		switch {
		case j == c.len() || i < o.len() && o.lo[i] < c.lo[j]:
			del(i)
			i++
		case i == o.len() || c.lo[j] < o.lo[i]:
			add(j)
			j++
		case o.lo[i+1] != c.lo[j+1]:
			del(i)
			add(j)
			i, j = i+1, j+1
		default:
			if o.bs[i].AddrPort() != c.bs[j].AddrPort() {
				dels = append(dels, o.start(base, i))
				adds = append(adds, c.start(base, j))
			}
			i, j = i+1, j+1
		}
	}
	if len(dels) > 0 {
		d.delElem(set, dels...)
	}
	if len(adds) > 0 {
		d.addElem(set, adds...)
	}
}

// delta works out what a step changes in the table. A port whose
// endpoints alone changed moves only its slots' ranges: its chains and
// its frontends' elements are the same in both fragments.
func (s *step) delta(m *model) *delta {
	d := newDelta()
	if s.node != nil {
		d.chains(m.node.chains, s.node.chains)
		d.elemMaps(m.node.elems, s.node.elems)
	}
	for _, pp := range s.removed {
		d.port(pp.sp.Key, s.p.fragment(pp, m.cfg), nil)
	}
	for _, pp := range s.added {
		d.port(pp.sp.Key, nil, s.p.fragment(pp, s.cfg))
	}
	for _, c := range s.changed {
		if c.endpoints {
			d.owner = c.cur.sp.Key
			d.slots(slotRanges(c.old), slotRanges(c.cur))
			d.owner = nil
			continue
		}
		d.port(c.cur.sp.Key, s.p.fragment(c.old, m.cfg), s.p.fragment(c.cur, s.cfg))
	}
	for _, k := range slices.SortedFunc(maps.Keys(s.refs), compareRefKeys) {
		was, now := m.refs[k], s.refs[k]
		switch {
		case was == 0 && now > 0:
			d.addElem(k.set, k.ref().elem())
		case was > 0 && now == 0:
			d.delElem(k.set, k.ref().elem())
		}
	}
	for _, x := range slices.Sorted(maps.Keys(s.shards)) {
		was, now := m.shards[x], s.shards[x]
		switch {
		case was == 0 && now > 0:
			d.addSets = append(d.addSets, x)
		case was > 0 && now == 0:
			d.delSets = append(d.delSets, x)
		}
	}
	return d
}

// batch writes the delta into a batch, in an order the kernel accepts,
// each part as its owner's.
func (d *delta) batch(table string, b *nfnl.Batch) error {
	for _, set := range slices.Sorted(maps.Keys(d.delElems)) {
		owned(b, d.delElems[set], d.delOwners[set], func(es []elem) {
			b.DelElements(nfnl.Inet, table, set.name(), elements(es))
		})
	}
	for _, c := range d.flush {
		b.SetOwner(d.chainOwner[c])
		b.FlushChain(nfnl.Inet, table, c)
	}
	for _, c := range d.delete {
		b.SetOwner(d.chainOwner[c])
		b.DelChain(nfnl.Inet, table, c)
	}
	b.SetOwner(nil)
	for _, s := range d.delSets {
		b.DelSet(nfnl.Inet, table, s.name())
	}
	for _, s := range d.addSets {
		b.AddSet(backendsDef(table, s).set)
	}
	owners := make([]any, len(d.write))
	for i, c := range d.write {
		owners[i] = d.chainOwner[c.name]
	}
	for _, c := range d.create {
		b.SetOwner(d.chainOwner[c.name])
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: c.name, Hook: c.hook})
	}
	if err := writeRules(table, d.write, owners, b); err != nil {
		return err
	}
	for _, set := range slices.Sorted(maps.Keys(d.addElems)) {
		es, runs := insertOrder(d.addElems[set], d.addOwners[set])
		owned(b, es, runs, func(es []elem) {
			b.AddElements(nfnl.Inet, table, set.name(), elements(es))
		})
	}
	b.SetOwner(nil)
	return nil
}

// owned calls add with each run of es that one owner holds, that owner
// set on the batch.
func owned(b *nfnl.Batch, es []elem, runs []ownerRun, add func([]elem)) {
	for i, r := range runs {
		to := len(es)
		if i+1 < len(runs) {
			to = runs[i+1].from
		}
		b.SetOwner(r.owner)
		add(es[r.from:to])
	}
}

// writeRules adds the chains' rules to the batch, each chain's as
// owners[i] says (nil owners: no one's).
func writeRules(table string, chains []chainPlan, owners []any, b *nfnl.Batch) error {
	for i, c := range chains {
		if owners != nil {
			b.SetOwner(owners[i])
		}
		for _, r := range c.rules {
			raw, err := r.encode()
			if err != nil {
				return fmt.Errorf("chain %s: %w", c.name, err)
			}
			b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: table, Chain: c.name, Raw: raw})
		}
	}
	return nil
}

// insertOrder returns the elements, and the runs of their owners, in an
// order the kernel accepts in an interval set that already holds other
// intervals below and above: by key from the lowest up, and at one key the
// end of the interval below before the start of the interval above. The
// kernel checks each element against its nearest neighbours already
// present, so an interval's start must come before its end.
func insertOrder(es []elem, runs []ownerRun) ([]elem, []ownerRun) {
	type ownedElem struct {
		e     elem
		owner any
	}
	s := make([]ownedElem, len(es))
	r := 0
	for i := range es {
		for r+1 < len(runs) && runs[r+1].from <= i {
			r++
		}
		s[i] = ownedElem{es[i], runs[r].owner}
	}
	slices.SortStableFunc(s, func(a, b ownedElem) int {
		return cmp.Or(bytes.Compare(a.e.key, b.e.key), cmp.Compare(b.e.flags, a.e.flags))
	})
	out := make([]elem, len(s))
	var sorted []ownerRun
	for i := range s {
		out[i] = s[i].e
		sorted = run(sorted, i, s[i].owner)
	}
	return out, sorted
}

func elements(es []elem) []nfnl.Element {
	out := make([]nfnl.Element, len(es))
	for i := range es {
		out[i] = es[i].element()
	}
	return out
}
