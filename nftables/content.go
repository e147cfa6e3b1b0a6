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
	c := &content{elems: map[setID][]elemPart{}, sets: p.setDefs(m)}
	for set, es := range m.node.elems {
		c.add(set, nil, es)
	}
	c.chains = append(c.chains, m.node.chains...)
	c.owners = make([]any, len(c.chains), len(c.chains)+3*len(m.ports))
	for _, pp := range m.sortedPorts() {
		var owner any = pp.sp.Key
		fr := p.fragment(pp, m.cfg)
		for _, x := range fr.elems {
			c.add(x.set, owner, x.es)
		}
		for _, r := range fr.backends {
			c.add(r.set, owner, backendElems(r.slot, r.bs, bucketCounts(r.bs)))
		}
		c.chains = append(c.chains, fr.chains...)
		for range fr.chains {
			c.owners = append(c.owners, owner)
		}
	}
	refs := map[setID][]elem{}
	for k := range m.refs {
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
	if err := writeChains(p.table, m.node.chains, nil, b); err != nil {
		return err
	}
	ports := m.sortedPorts()
	// Each port's chains and rules, then its elements in the dispatch map
	// and the firewall sets, which refer to its chains.
	// The backends maps are written one after the other, at the end:
	// they share one writer (and its buffer), which the ports never
	// reach.
	writers := map[setID]*elemWriter{}
	for _, d := range defs {
		if d.id.kind() != kindBackends {
			writers[d.id] = &elemWriter{b: b, table: p.table, set: d.set.Name}
		}
	}
	backends := &elemWriter{b: b, table: p.table}
	// The backends elements of a port are made in scratch, their bytes in
	// arena: a buffer that is only appended to, never reused, since the
	// writer holds the elements until it flushes; a full one is replaced.
	var scratch []elem
	var arena []byte
	byShard := map[setID][]*portPlan{}
	for _, pp := range ports {
		var owner any = pp.sp.Key
		fr := p.fragment(pp, m.cfg)
		if err := writeChains(p.table, fr.chains, owner, b); err != nil {
			return err
		}
		for _, x := range fr.elems {
			writers[x.set].add(owner, x.es...)
		}
		pp.eachShard(func(s setID) {
			if ps := byShard[s]; len(ps) == 0 || ps[len(ps)-1] != pp {
				byShard[s] = append(ps, pp)
			}
		})
	}
	for k := range m.refs {
		w := writers[k.set]
		w.add(nil, w.refElem(k))
	}
	for _, d := range defs {
		w := writers[d.id]
		switch d.id.kind() {
		case kindBackends:
			w = backends
			w.set = d.set.Name
			for _, pp := range byShard[d.id] {
				for i := range pp.uses {
					if pp.uses[i] && shardSet(pp.sp.Family, pp.slot[i]) == d.id {
						bs := targets(pp.sp, i)
						if need := len(bs) * backendElemBytes; cap(arena)-len(arena) < need {
							arena = make([]byte, 0, max(64<<10, need))
						}
						scratch, arena = appendBackendElems(scratch[:0], arena, pp.slot[i], bs, bucketCounts(bs))
						w.add(pp.sp.Key, scratch...)
					}
				}
			}
		default:
			w.add(nil, m.node.elems[d.id]...)
		}
		w.flush()
	}
	b.SetOwner(nil)
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
