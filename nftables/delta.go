package nftables

import (
	"bytes"
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// delta is the difference between two plans, in the order a batch must
// apply it: references go before what they refer to is deleted, and after
// what they refer to is created.
type delta struct {
	delElems map[string][]elem
	addElems map[string][]elem
	flush    []string    // chains whose rules are replaced or that go
	delete   []string    // chains that go
	create   []chainPlan // chains that are new
	write    []chainPlan // chains whose rules are written (new or changed)
	delSets  []string
	addSets  []string
}

func newDelta() *delta {
	return &delta{delElems: map[string][]elem{}, addElems: map[string][]elem{}}
}

func sameRules(a, b []rule) bool {
	return slices.EqualFunc(a, b, func(x, y rule) bool { return x.text == y.text })
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
		case !sameRules(o.rules, c.rules):
			d.flush = append(d.flush, c.name)
			d.write = append(d.write, c)
		}
		delete(prev, c.name)
	}
	for _, c := range old {
		if _, ok := prev[c.name]; ok {
			d.flush = append(d.flush, c.name)
			d.delete = append(d.delete, c.name)
		}
	}
}

func (d *delta) elems(set string, old, cur []elem) {
	if isIntervalSet(set) {
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
		d.addElems[set] = append(d.addElems[set], cur[i])
	}
	for _, o := range prev {
		d.delElems[set] = append(d.delElems[set], *o)
	}
}

// intervals diffs the elements of an interval set that one owner (a port,
// or the node) holds: if anything differs, all of the old ones go and all
// of the new ones come, since the kernel refuses to split an interval that
// stays in place.
func (d *delta) intervals(set string, old, cur []elem) {
	same := len(old) == len(cur)
	for i := 0; same && i < len(old); i++ {
		same = old[i].id() == cur[i].id() && old[i].same(&cur[i])
	}
	if same {
		return
	}
	d.delElems[set] = append(d.delElems[set], old...)
	d.addElems[set] = append(d.addElems[set], cur...)
}

// isIntervalSet reports whether a set is one of the table's interval sets
// kept by the kernel as a tree of interval starts and ends.
func isIntervalSet(set string) bool {
	return strings.HasPrefix(set, "backends") || strings.HasPrefix(set, setClusterCIDRs) || strings.HasPrefix(set, setServiceCIDRs)
}

// elemMaps diffs two maps of set name to elements.
func (d *delta) elemMaps(old, cur map[string][]elem) {
	for _, set := range slices.Sorted(maps.Keys(mergeKeys(old, cur))) {
		d.elems(set, old[set], cur[set])
	}
}

func mergeKeys(a, b map[string][]elem) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// port adds the difference between two fragments of one port (nil for a
// port that is new or gone).
func (d *delta) port(old, cur *portPlan) {
	var oc, cc []chainPlan
	var oe, ce map[string][]elem
	if old != nil {
		oc, oe = old.chains, old.elems
	}
	if cur != nil {
		cc, ce = cur.chains, cur.elems
	}
	d.chains(oc, cc)
	d.elemMaps(oe, ce)
}

// delta works out what a step changes in the table.
func (s *step) delta(m *model) *delta {
	d := newDelta()
	if s.node != nil {
		d.chains(m.node.chains, s.node.chains)
		d.elemMaps(m.node.elems, s.node.elems)
	}
	for _, pp := range s.removed {
		d.port(pp, nil)
	}
	for _, pp := range s.added {
		d.port(nil, pp)
	}
	for _, c := range s.changed {
		d.port(c[0], c[1])
	}
	for _, a := range slices.SortedFunc(maps.Keys(s.hairpin), netip.Addr.Compare) {
		was, now := m.hairpin[a], s.hairpin[a]
		set := setName(setHairpin, servicelb.FamilyOf(a))
		switch {
		case was == 0 && now > 0:
			d.addElems[set] = append(d.addElems[set], hairpinElem(a))
		case was > 0 && now == 0:
			d.delElems[set] = append(d.delElems[set], hairpinElem(a))
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

// batch writes the delta into a batch, in an order the kernel accepts.
func (d *delta) batch(table string, b *nfnl.Batch) {
	for _, set := range slices.Sorted(maps.Keys(d.delElems)) {
		b.DelElements(nfnl.Inet, table, set, elements(d.delElems[set]))
	}
	for _, c := range d.flush {
		b.FlushChain(nfnl.Inet, table, c)
	}
	for _, c := range d.delete {
		b.DelChain(nfnl.Inet, table, c)
	}
	for _, s := range d.delSets {
		b.DelSet(nfnl.Inet, table, s)
	}
	for _, s := range d.addSets {
		b.AddSet(backendsDef(table, shardFamily(s), s).set)
	}
	for _, c := range d.create {
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: c.name, Hook: c.hook})
	}
	for _, c := range d.write {
		for _, r := range c.rules {
			b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: table, Chain: c.name, Exprs: r.exprs})
		}
	}
	for _, set := range slices.Sorted(maps.Keys(d.addElems)) {
		b.AddElements(nfnl.Inet, table, set, insertOrder(d.addElems[set]))
	}
}

// insertOrder returns the elements in the order the kernel accepts them in
// an interval set: from the highest key down, an interval's start before
// the end of the interval below it at the same key. nft sends them so.
func insertOrder(es []elem) []nfnl.Element {
	s := slices.Clone(es)
	slices.SortStableFunc(s, func(a, b elem) int {
		return cmp.Or(bytes.Compare(b.Key, a.Key), cmp.Compare(a.Flags, b.Flags))
	})
	return elements(s)
}

func elements(es []elem) []nfnl.Element {
	out := make([]nfnl.Element, len(es))
	for i := range es {
		out[i] = es[i].Element
	}
	return out
}

// shardFamily tells a backends map's family from its name.
func shardFamily(name string) servicelb.Family {
	if strings.HasPrefix(name, "backends6") {
		return servicelb.IPv6
	}
	return servicelb.IPv4
}
