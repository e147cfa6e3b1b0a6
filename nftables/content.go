//go:build linux

package nftables

import (
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// content is a whole table, in the order it is declared and created: sets
// first, then chains. Each set's elements come in an order the kernel
// accepts: every owner's intervals in ascending order. A verify and Render
// make it; a write streams the same table into its batch without holding
// it whole (planner.write).
type content struct {
	sets []setDef
	// elems holds each set's elements as the parts their owners hold
	// (the node, each port, the shared elements).
	elems  map[setID][][]elem
	chains []chainPlan
}

// setDefs returns the definitions of the model's sets: the fixed ones,
// then the backends maps its ports read.
func (p *planner) setDefs(m *model) []setDef {
	var defs []setDef
	for _, f := range families {
		defs = append(defs, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shards)) {
		defs = append(defs, backendsDef(p.table, s))
	}
	return defs
}

func (p *planner) content(m *model) *content {
	c := &content{elems: map[setID][][]elem{}, sets: p.setDefs(m)}
	for set, es := range m.node.elems {
		c.add(set, es)
	}
	c.chains = append(c.chains, m.node.chains...)
	for _, pp := range m.sortedPorts() {
		fr := p.fragment(pp, m.cfg)
		for _, x := range fr.elems {
			c.add(x.set, x.es)
		}
		for _, r := range fr.backends {
			c.add(r.set, backendElems(r.slot, r.bs, bucketCounts(r.bs)))
		}
		c.chains = append(c.chains, fr.chains...)
	}
	refs := map[setID][]elem{}
	for k := range m.refs {
		r := k.ref()
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
	if err := writeChains(p.table, m.node.chains, b); err != nil {
		return err
	}
	ports := m.sortedPorts()
	// Each port's chains and rules, then its elements in the dispatch map
	// and the firewall sets, which refer to its chains.
	writers := map[setID]*elemWriter{}
	for _, d := range defs {
		writers[d.id] = &elemWriter{b: b, table: p.table, set: d.set.Name}
	}
	byShard := map[setID][]*portPlan{}
	for _, pp := range ports {
		fr := p.fragment(pp, m.cfg)
		if err := writeChains(p.table, fr.chains, b); err != nil {
			return err
		}
		for _, x := range fr.elems {
			writers[x.set].add(x.es...)
		}
		pp.eachShard(func(s setID) {
			if ps := byShard[s]; len(ps) == 0 || ps[len(ps)-1] != pp {
				byShard[s] = append(ps, pp)
			}
		})
	}
	for k := range m.refs {
		w := writers[k.set]
		w.add(w.refElem(k))
	}
	for _, d := range defs {
		w := writers[d.id]
		switch d.id.kind() {
		case kindBackends:
			for _, pp := range byShard[d.id] {
				for i := range pp.uses {
					if pp.uses[i] && shardSet(pp.sp.Family, pp.slot[i]) == d.id {
						w.add(backendElems(pp.slot[i], targets(pp.sp, i), bucketCounts(targets(pp.sp, i)))...)
					}
				}
			}
		default:
			w.add(m.node.elems[d.id]...)
		}
		w.flush()
	}
	return nil
}

// size estimates the bytes and the messages of the batch that writes m,
// so that the batch grows once.
func (m *model) size() (bytes, msgs int) {
	sets := 16 + len(m.shards)
	bytes, msgs = 300*sets, sets
	for _, ch := range m.node.chains {
		bytes += 100 + 250*len(ch.rules)
		msgs += 1 + len(ch.rules)
	}
	elems := len(m.refs)
	for _, pp := range m.ports {
		// An entry chain of three rules and the port's frontends.
		bytes += 1000
		msgs += 4
		elems += 1 + len(pp.sp.ExternalIPs) + len(pp.sp.LoadBalancerIPs) + len(pp.sp.NodeIPs)
		for i := range pp.uses {
			if pp.uses[i] {
				elems += 2 * len(targets(pp.sp, i))
			}
		}
	}
	// An element takes some 20 to 50 bytes; the batch holds what it
	// holds at once, so an estimate much over it would take memory it
	// never uses.
	bytes += 32 * elems
	msgs += sets + elems/256 // a message holds some hundreds
	return bytes, msgs
}

// writeChains adds chains and their rules to a batch.
func writeChains(table string, chains []chainPlan, b *nfnl.Batch) error {
	for _, ch := range chains {
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: ch.name, Hook: ch.hook})
	}
	return writeRules(table, chains, b)
}

// elemWriter adds a set's elements to a batch a chunk at a time. The
// bytes of the elements it makes itself (refElem) live in its arena until
// the chunk is written, which copies them into the batch.
type elemWriter struct {
	b          *nfnl.Batch
	table, set string
	buf        []nfnl.Element
	arena      []byte
}

const elemChunk = 1024

func (w *elemWriter) add(es ...elem) {
	for i := range es {
		if w.buf == nil {
			w.buf = make([]nfnl.Element, 0, elemChunk)
		}
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
	if len(w.buf) > 0 {
		w.b.AddElements(nfnl.Inet, w.table, w.set, w.buf)
		w.buf = w.buf[:0]
		w.arena = w.arena[:0]
	}
}
