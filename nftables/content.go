//go:build linux

package nftables

import (
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// content is a whole table, in the order it is declared and created: sets
// first, then chains. Each set's elements come in an order the kernel
// accepts: every owner's intervals in ascending order.
type content struct {
	sets   []setDef
	elems  map[setID][]elem
	chains []chainPlan
}

func (p *planner) content(m *model) *content {
	c := &content{elems: map[setID][]elem{}}
	for _, f := range families {
		c.sets = append(c.sets, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shards)) {
		c.sets = append(c.sets, backendsDef(p.table, s))
	}
	counts := map[setID]int{}
	for _, pp := range m.ports {
		for _, x := range pp.elems {
			counts[x.set] += len(x.es)
		}
		for _, r := range pp.backends {
			counts[r.set] += 2 * len(r.bs)
		}
	}
	for set, n := range counts {
		c.elems[set] = make([]elem, 0, n)
	}
	add := func(es map[setID][]elem) {
		for set, e := range es {
			c.elems[set] = append(c.elems[set], e...)
		}
	}
	add(m.node.elems)
	c.chains = append(c.chains, m.node.chains...)
	for _, pp := range m.sortedPorts() {
		for _, x := range pp.elems {
			c.elems[x.set] = append(c.elems[x.set], x.es...)
		}
		for _, r := range pp.backends {
			c.elems[r.set] = append(c.elems[r.set], backendElems(r.slot, r.bs, bucketCounts(r.bs))...)
		}
		c.chains = append(c.chains, pp.chains...)
	}
	for _, r := range slices.SortedFunc(maps.Keys(m.refs), compareRefs) {
		c.elems[r.set] = append(c.elems[r.set], r.elem())
	}
	return c
}

// create writes the whole content into a batch: sets, chains, rules and
// elements, in that order.
func (c *content) create(table string, b *nfnl.Batch) error {
	size, msgs := c.size()
	b.Grow(size)
	b.GrowMessages(msgs)
	for _, d := range c.sets {
		b.AddSet(d.set)
	}
	for _, ch := range c.chains {
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: ch.name, Hook: ch.hook})
	}
	if err := writeRules(table, c.chains, b); err != nil {
		return err
	}
	for _, d := range c.sets {
		addElements(b, table, d.set.Name, c.elems[d.id])
	}
	return nil
}

// size estimates the bytes and the messages of the batch that creates the
// content, so that the batch grows once.
func (c *content) size() (bytes, msgs int) {
	bytes = 300 * len(c.sets)
	msgs = len(c.sets) + len(c.chains)
	for _, ch := range c.chains {
		bytes += 100 + 250*len(ch.rules)
		msgs += len(ch.rules)
	}
	for _, es := range c.elems {
		bytes += 64 * len(es)
		msgs += 1 + len(es)/256 // a message holds some hundreds
	}
	return bytes, msgs
}

// addElements adds elements to a set, converting them a chunk at a time.
func addElements(b *nfnl.Batch, table, set string, es []elem) {
	const chunk = 1024
	buf := make([]nfnl.Element, 0, min(chunk, len(es)))
	for len(es) > 0 {
		n := min(chunk, len(es))
		buf = buf[:0]
		for i := range es[:n] {
			buf = append(buf, es[i].element())
		}
		b.AddElements(nfnl.Inet, table, set, buf)
		es = es[n:]
	}
}
