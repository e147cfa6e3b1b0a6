package servicelb

import (
	"hash/maphash"
	"math/bits"
	"slices"
)

// pmap is a persistent map, a hash array mapped trie: each node holds up
// to 32 slots, each a key and value (a leaf) or a node one level down,
// chosen by five bits of the key's hash a level. A State and the Builder
// that made it share every node: a Builder writes in place only the nodes
// its owner made since it last shared them, and copies the path to any
// other, so that a change costs O(log n) whatever States hold the map, and
// a State costs nothing to take. Two maps that share nodes are compared
// in what differs alone (diff): the States of one Builder, of a Builder
// made by Edit, and those of Without, cost their changes to Diff.
type pmap[K comparable, V any] struct {
	root *pnode[K, V]
	n    int
}

type pnode[K comparable, V any] struct {
	bits  uint32
	slots []pslot[K, V]
	// owner is the writer that made the node and may change it in place
	// until it shares it; nil for a node no one may change.
	owner *owner
}

// pslot is a leaf (child nil) or a node one level down.
type pslot[K comparable, V any] struct {
	child *pnode[K, V]
	hash  uint64
	key   K
	val   V
}

// owner is a writer's right to change the nodes it made in place: a
// writer that shares its map takes a new owner. It is not empty, so that
// two owners never share an address.
type owner struct{ _ byte }

// Past the last level the hash has no bits left: a node there holds its
// leaves in a list, compared by key.
const (
	pmapBits      = 5
	pmapLastShift = 60
)

var pmapSeed = maphash.MakeSeed()

// pmapHashMask keeps every bit of a hash; tests keep a few, so that keys
// share hashes and the lists past the last level fill.
var pmapHashMask = ^uint64(0)

func hashOf[K comparable](k K) uint64 { return maphash.Comparable(pmapSeed, k) & pmapHashMask }

// slot returns the index of the slot of hash h at shift in n, and
// whether n holds it.
func (n *pnode[K, V]) slot(h uint64, shift uint) (bit uint32, i int, ok bool) {
	bit = 1 << ((h >> shift) & 31)
	return bit, bits.OnesCount32(n.bits & (bit - 1)), n.bits&bit != 0
}

func (m *pmap[K, V]) get(k K) (V, bool) {
	h := hashOf(k)
	n := m.root
	for shift := uint(0); n != nil; shift += pmapBits {
		if shift > pmapLastShift {
			for i := range n.slots {
				if n.slots[i].key == k {
					return n.slots[i].val, true
				}
			}
			break
		}
		_, i, ok := n.slot(h, shift)
		if !ok {
			break
		}
		s := &n.slots[i]
		if s.child == nil {
			if s.key == k {
				return s.val, true
			}
			break
		}
		n = s.child
	}
	var zero V
	return zero, false
}

// set adds or replaces k's value, changing in place the nodes o owns.
func (m *pmap[K, V]) set(o *owner, k K, v V) {
	added := false
	m.root = m.root.with(o, 0, pslot[K, V]{hash: hashOf(k), key: k, val: v}, &added)
	if added {
		m.n++
	}
}

// delete removes k, changing in place the nodes o owns.
func (m *pmap[K, V]) delete(o *owner, k K) {
	removed := false
	m.root = m.root.without(o, 0, hashOf(k), k, &removed)
	if removed {
		m.n--
	}
}

// editable returns n if o may change it, else a copy o owns.
func (n *pnode[K, V]) editable(o *owner) *pnode[K, V] {
	if o != nil && n.owner == o {
		return n
	}
	return &pnode[K, V]{bits: n.bits, slots: append(make([]pslot[K, V], 0, len(n.slots)), n.slots...), owner: o}
}

func (n *pnode[K, V]) with(o *owner, shift uint, leaf pslot[K, V], added *bool) *pnode[K, V] {
	if n == nil {
		*added = true
		return leafNode(o, shift, leaf)
	}
	if shift > pmapLastShift {
		c := n.editable(o)
		if i := slices.IndexFunc(c.slots, func(s pslot[K, V]) bool { return s.key == leaf.key }); i >= 0 {
			c.slots[i] = leaf
		} else {
			c.slots = append(c.slots, leaf)
			*added = true
		}
		return c
	}
	bit, i, ok := n.slot(leaf.hash, shift)
	if !ok {
		*added = true
		c := n
		if o == nil || n.owner != o {
			c = &pnode[K, V]{bits: n.bits, owner: o}
		}
		c.bits |= bit
		c.slots = insertExact(n.slots, i, leaf)
		return c
	}
	s := n.slots[i]
	c := n.editable(o)
	switch {
	case s.child != nil:
		c.slots[i].child = s.child.with(o, shift+pmapBits, leaf, added)
	case s.key == leaf.key:
		c.slots[i] = leaf
	default:
		*added = true
		c.slots[i] = pslot[K, V]{child: pairNode(o, shift+pmapBits, s, leaf)}
	}
	return c
}

// insertExact returns s with v inserted at i, in a new array of the
// length needed and no more: a node keeps its array as long as it lives,
// shared by every State that holds it, and most nodes never grow again.
func insertExact[T any](s []T, i int, v T) []T {
	out := make([]T, len(s)+1)
	copy(out, s[:i])
	out[i] = v
	copy(out[i+1:], s[i:])
	return out
}

func leafNode[K comparable, V any](o *owner, shift uint, leaf pslot[K, V]) *pnode[K, V] {
	n := &pnode[K, V]{slots: []pslot[K, V]{leaf}, owner: o}
	if shift <= pmapLastShift {
		n.bits = 1 << ((leaf.hash >> shift) & 31)
	}
	return n
}

// pairNode returns a node at shift holding two leaves of distinct keys.
func pairNode[K comparable, V any](o *owner, shift uint, a, b pslot[K, V]) *pnode[K, V] {
	if shift > pmapLastShift {
		return &pnode[K, V]{slots: []pslot[K, V]{a, b}, owner: o}
	}
	ia, ib := (a.hash>>shift)&31, (b.hash>>shift)&31
	switch {
	case ia == ib:
		return &pnode[K, V]{bits: 1 << ia, slots: []pslot[K, V]{{child: pairNode(o, shift+pmapBits, a, b)}}, owner: o}
	case ia > ib:
		a, b = b, a
	}
	return &pnode[K, V]{bits: 1<<ia | 1<<ib, slots: []pslot[K, V]{a, b}, owner: o}
}

// without returns n without k. A node left with one leaf and nothing else
// is folded into its parent's slot, so that a map has one shape for its
// contents whatever its history.
func (n *pnode[K, V]) without(o *owner, shift uint, h uint64, k K, removed *bool) *pnode[K, V] {
	if n == nil {
		return nil
	}
	if shift > pmapLastShift {
		i := slices.IndexFunc(n.slots, func(s pslot[K, V]) bool { return s.key == k })
		if i < 0 {
			return n
		}
		*removed = true
		if len(n.slots) == 1 {
			return nil
		}
		c := n.editable(o)
		c.slots = slices.Delete(c.slots, i, i+1)
		return c
	}
	bit, i, ok := n.slot(h, shift)
	if !ok {
		return n
	}
	s := n.slots[i]
	var child *pnode[K, V]
	if s.child != nil {
		child = s.child.without(o, shift+pmapBits, h, k, removed)
	} else if s.key != k {
		return n
	} else {
		*removed = true
	}
	if !*removed {
		return n
	}
	if child == nil && len(n.slots) == 1 {
		return nil
	}
	c := n.editable(o)
	switch {
	case child == nil:
		c.bits &^= bit
		c.slots = slices.Delete(c.slots, i, i+1)
	case len(child.slots) == 1 && child.slots[0].child == nil:
		c.slots[i] = child.slots[0]
	default:
		c.slots[i].child = child
	}
	return c
}

// each calls f for every key and value, in no particular order.
func (m *pmap[K, V]) each(f func(k K, v V)) { m.root.each(f) }

func (n *pnode[K, V]) each(f func(k K, v V)) {
	if n == nil {
		return
	}
	for i := range n.slots {
		if s := &n.slots[i]; s.child != nil {
			s.child.each(f)
		} else {
			f(s.key, s.val)
		}
	}
}

// diff calls f for every key whose value differs between m and o (by
// same, or present in one alone), in no particular order, and returns the
// number of leaves it looked at: it skips every node the two share.
func (m *pmap[K, V]) diff(o *pmap[K, V], same func(a, b V) bool, f func(k K, a, b V, inA, inB bool)) int {
	return diffNodes(m.root, o.root, 0, same, f)
}

func diffNodes[K comparable, V any](x, y *pnode[K, V], shift uint, same func(a, b V) bool, f func(k K, a, b V, inA, inB bool)) int {
	if x == y {
		return 0
	}
	if x == nil || y == nil || shift > pmapLastShift {
		return diffLeaves(leavesOf(x, nil), leavesOf(y, nil), same, f)
	}
	seen := 0
	for all := x.bits | y.bits; all != 0; all &= all - 1 {
		bit := all & -all
		var sx, sy *pslot[K, V]
		if x.bits&bit != 0 {
			sx = &x.slots[bits.OnesCount32(x.bits&(bit-1))]
		}
		if y.bits&bit != 0 {
			sy = &y.slots[bits.OnesCount32(y.bits&(bit-1))]
		}
		switch {
		case sx != nil && sy != nil && sx.child != nil && sy.child != nil:
			seen += diffNodes(sx.child, sy.child, shift+pmapBits, same, f)
			continue
		case sx != nil && sy != nil && sx.child == nil && sy.child == nil && sx.key == sy.key:
			// The common case of a change: one leaf, changed in place.
			if !same(sx.val, sy.val) {
				f(sx.key, sx.val, sy.val, true, true)
			}
			seen += 2
			continue
		}
		seen += diffLeaves(slotLeaves(sx), slotLeaves(sy), same, f)
	}
	return seen
}

func slotLeaves[K comparable, V any](s *pslot[K, V]) []pslot[K, V] {
	switch {
	case s == nil:
		return nil
	case s.child != nil:
		return leavesOf(s.child, nil)
	}
	return []pslot[K, V]{*s}
}

func leavesOf[K comparable, V any](n *pnode[K, V], out []pslot[K, V]) []pslot[K, V] {
	if n == nil {
		return out
	}
	for _, s := range n.slots {
		if s.child != nil {
			out = leavesOf(s.child, out)
		} else {
			out = append(out, s)
		}
	}
	return out
}

// diffLeaves compares two lists of leaves by key.
func diffLeaves[K comparable, V any](xs, ys []pslot[K, V], same func(a, b V) bool, f func(k K, a, b V, inA, inB bool)) int {
	var zero V
	in := make(map[K]int, len(ys))
	for i, y := range ys {
		in[y.key] = i
	}
	for _, x := range xs {
		i, ok := in[x.key]
		switch {
		case !ok:
			f(x.key, x.val, zero, true, false)
		case !same(x.val, ys[i].val):
			f(x.key, x.val, ys[i].val, true, true)
		}
		delete(in, x.key)
	}
	for _, i := range in {
		f(ys[i].key, zero, ys[i].val, false, true)
	}
	return len(xs) + len(ys)
}
