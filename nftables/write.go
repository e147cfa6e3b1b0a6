//go:build linux

package nftables

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
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
	if old != nil {
		oc, oe = old.chains, old.elems
	}
	if cur != nil {
		cc, ce = cur.chains, cur.elems
	}
	d.chains(oc, cc)
	d.setElems(oe, ce)
}

// setElems diffs a port's elements.
func (d *delta) setElems(old, cur []setElems) {
	find := func(xs []setElems, set setID) ([]elem, bool) {
		for _, x := range xs {
			if x.set == set {
				return x.es, true
			}
		}
		return nil, false
	}
	for _, x := range cur {
		was, _ := find(old, x.set)
		d.elems(x.set, was, x.es)
	}
	for _, x := range old {
		if _, ok := find(cur, x.set); !ok {
			d.elems(x.set, x.es, nil)
		}
	}
}

// delta works out what a step changes in the table. The shared chains
// change only with the node, or when a shape or a bucket set comes or
// goes.
func (s *step) delta(m *model) *delta {
	d := newDelta()
	if s.node != nil {
		d.elemMaps(m.node.elems, s.node.elems)
	}
	for _, pp := range s.removed {
		d.port(pp.sp.Key, s.p.fragment(pp, m.cfg), nil)
	}
	for _, pp := range s.added {
		d.port(pp.sp.Key, nil, s.p.fragment(pp, s.cfg))
	}
	for _, c := range s.changed {
		d.port(c.cur.sp.Key, s.p.fragment(c.old, m.cfg), s.p.fragment(c.cur, s.cfg))
	}
	for _, k := range slices.SortedFunc(maps.Keys(s.refs), compareRefKeys) {
		was, now := m.refs.get(k), s.refs[k]
		switch {
		case was == 0 && now > 0:
			d.addElem(k.set, k.ref().elem())
		case was > 0 && now == 0:
			d.delElem(k.set, k.ref().elem())
		}
	}
	moved := false
	for _, x := range slices.Sorted(maps.Keys(s.shared)) {
		was, now := m.shared[x], s.shared[x]
		switch {
		case was == 0 && now > 0:
			d.addSets = append(d.addSets, x)
			moved = true
		case was > 0 && now == 0:
			d.delSets = append(d.delSets, x)
			moved = true
		}
	}
	if s.node != nil || moved {
		next := maps.Clone(m.shared)
		for x, n := range s.shared {
			if n > 0 {
				next[x] = n
			} else {
				delete(next, x)
			}
		}
		node := &m.node
		if s.node != nil {
			node = s.node
		}
		d.chains(s.p.nodeChains(m), append(slices.Clip(node.chains), s.p.shared(s.cfg, next)...))
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
		b.AddSet(dynamicDef(table, s).set)
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

// replaceBatch builds the batch that makes the table hold exactly c,
// whatever it holds now, in one transaction and without deleting the
// table: an existing table (left by an earlier process, or changed by
// someone else) is adopted. Its rules are flushed, sets whose definition
// differs are deleted, those that match are emptied (except the affinity
// sets, whose pins survive), chains kproxy does not want are deleted, and
// then everything is written. Established connections keep their conntrack
// entries, so nothing that flows is cut.
func (p *Proxier) replaceBatch(ctx context.Context, m *model) (*nfnl.Batch, error) {
	b := &nfnl.Batch{}
	_, err := p.conn.Table(ctx, nfnl.Inet, p.opts.Table)
	switch {
	case errors.Is(err, nfnl.ErrNotExist):
		b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: p.opts.Table})
		return b, p.plan.write(m, b)
	case err != nil:
		return nil, err
	}
	chains, err := p.conn.Chains(ctx, nfnl.Inet, p.opts.Table)
	if err != nil {
		return nil, err
	}
	sets, err := p.conn.Sets(ctx, nfnl.Inet, p.opts.Table)
	if err != nil {
		return nil, err
	}
	t := p.opts.Table
	b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: t})
	b.FlushTable(nfnl.Inet, t)
	want := map[string]nfnl.Set{}
	for _, d := range p.plan.setDefs(m) {
		want[d.set.Name] = d.set
	}
	for _, s := range sets {
		w, ok := want[s.Name]
		switch {
		case s.Flags&nfnl.SetAnonymous != 0:
		case !ok || !sameSet(s, w):
			b.DelSet(nfnl.Inet, t, s.Name)
		case !isAffinitySet(s.Name):
			b.FlushSet(nfnl.Inet, t, s.Name)
		}
	}
	hooks := map[string]*nfnl.Hook{}
	for _, ch := range p.plan.nodeChains(m) {
		hooks[ch.name] = ch.hook
	}
	for _, pp := range m.ports {
		chainNames(pp, func(name string) { hooks[name] = nil })
	}
	for _, ch := range chains {
		h, ok := hooks[ch.Name]
		if !ok || !sameHook(ch.Hook, h) {
			b.DelChain(nfnl.Inet, t, ch.Name)
		}
	}
	return b, p.plan.write(m, b)
}

func isAffinitySet(name string) bool {
	return name == fixedSet(kindAffinity, servicelb.IPv4).name() || name == fixedSet(kindAffinity, servicelb.IPv6).name()
}

// write writes the whole table of m into a batch: sets, then the node's
// chains and rules, then each port's, then the elements set by set. It
// makes each port's fragment when it writes the port, and the elements of
// each set when it writes the set, so that the batch is all it holds of a
// large table.
func (p *planner) write(m *model, b *nfnl.Batch) error {
	size, msgs := m.size()
	b.Grow(size)
	b.GrowMessages(msgs)
	defs := p.setDefs(m)
	for _, d := range defs {
		b.AddSet(d.set)
	}
	if err := writeChains(p.table, p.nodeChains(m), nil, b); err != nil {
		return err
	}
	// Each port's chains and rules, then its elements, which refer to
	// its chains, set by set: a writer each.
	writers := map[setID]*elemWriter{}
	for _, d := range defs {
		writers[d.id] = &elemWriter{b: b, table: p.table, set: d.set.Name}
	}
	// The ports' elements come from one arena: a writer keeps their
	// bytes until it flushes, and copies the elements themselves at once.
	a := &arena{}
	var fr fragment
	for _, pp := range m.sortedPorts() {
		var owner any = pp.sp.Key
		fr = fragment{elems: fr.elems[:0]}
		a.reuseElems()
		p.fragmentInto(&fr, pp, m.cfg, a)
		if err := writeChains(p.table, fr.chains, owner, b); err != nil {
			return err
		}
		for _, x := range fr.elems {
			writers[x.set].add(owner, x.es...)
		}
	}
	for k := range m.refs.all() {
		w := writers[k.set]
		w.add(nil, w.refElem(k))
	}
	for _, d := range defs {
		w := writers[d.id]
		w.add(nil, m.node.elems[d.id]...)
		w.flush()
	}
	b.SetOwner(nil)
	return nil
}

// size estimates the bytes and the messages of the batch that writes m,
// so that the batch grows once.
func (m *model) size() (bytes, msgs int) {
	sets := 20 + len(m.shared)
	bytes, msgs = 300*sets, sets
	for _, ch := range m.node.chains {
		bytes += 100 + 250*len(ch.rules)
		msgs += 1 + len(ch.rules)
	}
	elems := m.refs.len()
	for _, pp := range m.ports {
		// Each frontend in a shape set and a bucket set or two, and
		// their endpoints; an affinity port's chains.
		fronts := 1 + len(pp.sp.ExternalIPs) + len(pp.sp.LoadBalancerIPs) + len(pp.sp.NodeIPs)
		elems += 2 * fronts
		for i := range pp.uses {
			if pp.uses[i] {
				elems += fronts * len(targets(pp.sp, i))
			}
		}
		if pp.sp.Affinity > 0 {
			bytes += 1000 + 500*len(pp.sp.Cluster)
			msgs += 4 + 2*len(pp.sp.Cluster)
		}
	}
	// An element takes some 20 to 50 bytes; the batch holds what it
	// holds at once, so an estimate much over it would take memory it
	// never uses.
	bytes += 32 * elems
	msgs += sets + elems/256 // a message holds some hundreds
	return bytes, msgs
}

// writeChains adds chains and their rules to a batch, as owner's.
func writeChains(table string, chains []chainPlan, owner any, b *nfnl.Batch) error {
	b.SetOwner(owner)
	for _, ch := range chains {
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: ch.name, Hook: ch.hook})
	}
	return writeRules(table, chains, nil, b)
}

// elemWriter adds a set's elements to a batch a chunk at a time, each as
// its owner's: the runs of one owner's elements go into the same
// messages (nfnl.Batch.SetOwner). The bytes of the elements it makes
// itself (refElem) live in its arena until the chunk is written, which
// copies them into the batch.
type elemWriter struct {
	b          *nfnl.Batch
	table, set string
	buf        []nfnl.Element
	runs       []ownerRun
	arena      []byte
}

const elemChunk = 1024

// add adds owner's elements.
func (w *elemWriter) add(owner any, es ...elem) {
	for i := range es {
		if w.buf == nil {
			w.buf = make([]nfnl.Element, 0, elemChunk)
		}
		w.runs = run(w.runs, len(w.buf), owner)
		w.buf = append(w.buf, es[i].element())
		if len(w.buf) == elemChunk {
			w.flush()
		}
	}
}

// refElem returns the element of a shared element, its bytes in the
// arena: valid until the writer's next flush.
func (w *elemWriter) refElem(k refKey) elem {
	if cap(w.arena)-len(w.arena) < 32 {
		w.arena = make([]byte, 0, (elemChunk+1)*32)
	}
	at := len(w.arena)
	r := k.ref()
	w.arena = appendAddr(w.arena, r.addr)
	if k.set.kind() == kindHairpin {
		w.arena = appendAddr(w.arena, r.addr)
	}
	return elem{key: w.arena[at:len(w.arena):len(w.arena)]}
}

func (w *elemWriter) flush() {
	for i, r := range w.runs {
		to := len(w.buf)
		if i+1 < len(w.runs) {
			to = w.runs[i+1].from
		}
		w.b.SetOwner(r.owner)
		w.b.AddElements(nfnl.Inet, w.table, w.set, w.buf[r.from:to])
	}
	w.buf, w.runs, w.arena = w.buf[:0], w.runs[:0], w.arena[:0]
}
