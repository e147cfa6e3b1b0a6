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
	sets []setDef
	// elems holds each set's elements as the parts their owners hold
	// (the node, each port, the shared elements), in order: the content
	// copies no element of the model.
	elems  map[setID][][]elem
	chains []chainPlan
}

func (p *planner) content(m *model) *content {
	c := &content{elems: map[setID][][]elem{}}
	for _, f := range families {
		c.sets = append(c.sets, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shards)) {
		c.sets = append(c.sets, backendsDef(p.table, s))
	}
	for set, es := range m.node.elems {
		c.add(set, es)
	}
	c.chains = append(c.chains, m.node.chains...)
	for _, pp := range m.sortedPorts() {
		for _, x := range pp.elems {
			c.add(x.set, x.es)
		}
		for _, r := range pp.backends {
			c.add(r.set, backendElems(r.slot, r.bs, bucketCounts(r.bs)))
		}
		c.chains = append(c.chains, pp.chains...)
	}
	counts := map[setID]int{}
	for r := range m.refs {
		counts[r.set]++
	}
	refs := make(map[setID][]elem, len(counts))
	for set, n := range counts {
		refs[set] = make([]elem, 0, n)
	}
	for _, r := range slices.SortedFunc(maps.Keys(m.refs), compareRefs) {
		refs[r.set] = append(refs[r.set], r.elem())
	}
	for set, es := range refs {
		c.add(set, es)
	}
	return c
}

// add appends a part of a set's elements.
func (c *content) add(set setID, es []elem) {
	if len(es) > 0 {
		c.elems[set] = append(c.elems[set], es)
	}
}

// setElems returns a set's elements in one slice.
func (c *content) setElems(set setID) []elem { return slices.Concat(c.elems[set]...) }

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
	for _, parts := range c.elems {
		n := 0
		for _, es := range parts {
			n += len(es)
		}
		bytes += 64 * n
		msgs += 1 + n/256 // a message holds some hundreds
	}
	return bytes, msgs
}

// addElements adds the parts of a set's elements, converting them a
// chunk at a time.
func addElements(b *nfnl.Batch, table, set string, parts [][]elem) {
	const chunk = 1024
	var buf []nfnl.Element
	for _, es := range parts {
		for i := range es {
			if buf == nil {
				buf = make([]nfnl.Element, 0, chunk)
			}
			buf = append(buf, es[i].element())
			if len(buf) == chunk {
				b.AddElements(nfnl.Inet, table, set, buf)
				buf = buf[:0]
			}
		}
	}
	if len(buf) > 0 {
		b.AddElements(nfnl.Inet, table, set, buf)
	}
}
