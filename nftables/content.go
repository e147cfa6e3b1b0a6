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

func (p *planner) content(m *model) *content {
	c := &content{elems: map[setID][]elemPart{}}
	for _, f := range families {
		c.sets = append(c.sets, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shards)) {
		c.sets = append(c.sets, backendsDef(p.table, s))
	}
	for set, es := range m.node.elems {
		c.add(set, nil, es)
	}
	c.chains = append(c.chains, m.node.chains...)
	c.owners = make([]any, len(c.chains), len(c.chains)+3*len(m.ports))
	for _, pp := range m.sortedPorts() {
		var owner any = pp.key
		for _, x := range pp.elems {
			c.add(x.set, owner, x.es)
		}
		for _, r := range pp.backends {
			c.add(r.set, owner, backendElems(r.slot, r.bs, bucketCounts(r.bs)))
		}
		c.chains = append(c.chains, pp.chains...)
		for range pp.chains {
			c.owners = append(c.owners, owner)
		}
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

// create writes the whole content into a batch: sets, chains, rules and
// elements, in that order.
func (c *content) create(table string, b *nfnl.Batch) error {
	size, msgs := c.size()
	b.Grow(size)
	b.GrowMessages(msgs)
	for _, d := range c.sets {
		b.AddSet(d.set)
	}
	for i, ch := range c.chains {
		b.SetOwner(c.owners[i])
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: ch.name, Hook: ch.hook})
	}
	if err := writeRules(table, c.chains, c.owners, b); err != nil {
		return err
	}
	for _, d := range c.sets {
		addElements(b, table, d.set.Name, c.elems[d.id])
	}
	b.SetOwner(nil)
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
		for _, p := range parts {
			n += len(p.es)
		}
		bytes += 64 * n
		msgs += 1 + n/256 // a message holds some hundreds
	}
	return bytes, msgs
}

// addElements adds the parts of a set's elements, each as its owner's,
// converting them a chunk at a time. The parts share messages.
func addElements(b *nfnl.Batch, table, set string, parts []elemPart) {
	const chunk = 1024
	var buf []nfnl.Element
	for _, p := range parts {
		b.SetOwner(p.owner)
		for i := range p.es {
			if buf == nil {
				buf = make([]nfnl.Element, 0, chunk)
			}
			buf = append(buf, p.es[i].element())
			if len(buf) == chunk {
				b.AddElements(nfnl.Inet, table, set, buf)
				buf = buf[:0]
			}
		}
		if len(buf) > 0 {
			b.AddElements(nfnl.Inet, table, set, buf)
			buf = buf[:0]
		}
	}
}
