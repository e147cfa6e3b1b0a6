//go:build linux

package xtables

import (
	"slices"
)

// table writes the messages that make table t move from st to what tt
// asks, in an order the kernel accepts within one batch: rule deletions,
// flushes, chain deletions, chain creations, the chains of Parts group by
// group, whole chains, keyed rules, jumps. State updates run only after
// the batch succeeds.
//
// Each message belongs to the owner of its chain or key (Tx.SetOwner); the
// table, builtin and keyed chains and jumps to no one.
func (b *builder) table(t Table, st *tableState, tt *txTable) error {
	owner := func(name string) { b.m.b.SetOwner(tt.owners[name]) }
	b.m.b.SetOwner(nil)
	b.ensureTable(t, st)
	for _, chain := range sortedKeys(tt.keyed) {
		b.dropKeyed(t, st, chain, tt.keyed[chain])
	}
	b.m.b.SetOwner(nil)
	for _, chain := range sortedKeys(tt.jumps) {
		b.dropJumps(t, st, chain, tt.jumps[chain])
	}
	setNames, delNames := sortedKeys(tt.set), sortedKeys(tt.del)
	for _, name := range setNames {
		if st.chains[name] {
			owner(name)
			b.m.flushChain(t, name)
		}
	}
	if tt.parts != nil {
		for _, c := range tt.parts.flush {
			b.m.b.SetOwner(c.owner)
			b.m.flushChain(t, c.name)
		}
	}
	// Every chain to delete is flushed before any is deleted: they may
	// jump to one another.
	for _, name := range delNames {
		if st.chains[name] {
			owner(name)
			b.m.flushChain(t, name)
		}
	}
	for _, name := range delNames {
		if st.chains[name] {
			owner(name)
			b.m.delChain(t, name)
			b.onSuccess = append(b.onSuccess, func() { delete(st.chains, name); delete(st.keyed, name); st.use-- })
		}
	}
	for _, name := range slices.Concat(setNames, sortedKeys(tt.keyed)) {
		owner(name)
		b.ensureChain(t, st, name)
	}
	if tt.parts != nil {
		if err := b.writeParts(t, st, tt.parts); err != nil {
			return err
		}
	}
	for _, name := range setNames {
		owner(name)
		for i := range tt.set[name] {
			if _, err := b.addRule(t, name, &tt.set[name][i], position{}, nil); err != nil {
				return err
			}
		}
	}
	for _, chain := range sortedKeys(tt.keyed) {
		if err := b.placeKeyed(t, st, chain, tt.keyed[chain]); err != nil {
			return err
		}
	}
	b.m.b.SetOwner(nil)
	for _, chain := range sortedKeys(tt.jumps) {
		if err := b.placeJumps(t, st, chain, tt.jumps[chain]); err != nil {
			return err
		}
	}
	return nil
}

// writeParts writes the chains of Parts that the kernel does not hold as
// they should be, group by group: the group's chains created where
// missing, then their rules, all the group's owner's. The rules are
// encoded as they come and not kept.
func (b *builder) writeParts(t Table, st *tableState, p *txParts) error {
	for owner, group := range p.seq {
		b.m.b.SetOwner(owner)
		for _, c := range group {
			if !p.same[c.Name] {
				b.ensureChain(t, st, c.Name)
			}
		}
		for _, c := range group {
			if p.same[c.Name] {
				continue
			}
			for i := range c.Rules {
				if _, err := b.addRule(t, c.Name, &c.Rules[i], position{}, nil); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// ensureTable creates the table and its builtin chains when missing.
func (b *builder) ensureTable(t Table, st *tableState) {
	if !st.exists {
		b.m.newTable(t)
		b.onSuccess = append(b.onSuccess, func() { st.exists = true })
	}
	for _, bc := range BaseChains(t.Name) {
		if st.base[bc.Name] {
			continue
		}
		b.m.newBaseChain(t, bc)
		b.pt(t).allocs++
		name := bc.Name
		b.onSuccess = append(b.onSuccess, func() { st.base[name] = true; st.use++ })
	}
}

// ensureChain creates a user chain when missing.
func (b *builder) ensureChain(t Table, st *tableState, name string) {
	if st.chains[name] {
		return
	}
	b.m.newChain(t, name)
	b.pt(t).allocs++
	b.onSuccess = append(b.onSuccess, func() {
		if !st.chains[name] {
			st.chains[name] = true
			st.use++
		}
	})
}

// dropKeyed deletes the rules of the keys a keyed change replaces or
// removes, or flushes the whole chain for a reset.
func (b *builder) dropKeyed(t Table, st *tableState, chain string, k *txKeyed) {
	kc := st.keyed[chain]
	if k.reset {
		if st.chains[chain] {
			b.m.flushChain(t, chain)
		}
		return
	}
	if kc == nil {
		return
	}
	for _, key := range sortedKeys(k.set) {
		i, ok := kc.find(key)
		if !ok {
			continue
		}
		e := kc.entries[i]
		if sameSigs(e.sigs, sigsOf(t.Family, k.set[key])) {
			delete(k.set, key) // unchanged: keep it as it is
			continue
		}
		b.m.b.SetOwner(k.owners[key])
		for _, h := range e.handles {
			b.m.delRule(t, chain, h)
		}
	}
}

// sigsOf returns the signatures of rules; a rule that does not encode
// gets 0, so that it never compares equal and its error surfaces when it
// is written.
func sigsOf(f Family, rules []Rule) []uint64 {
	var s signer
	out := make([]uint64, len(rules))
	for i := range rules {
		out[i], _ = s.sig(f, &rules[i])
	}
	return out
}

func sameSigs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] || a[i] == 0 {
			return false
		}
	}
	return true
}

// placeKeyed inserts the rules of new and changed keys at their place in
// key order: in ascending key order, each before the first rule of the
// next key that stays (placed by handle; inserting one after another
// before the same rule keeps them in order), or at the end of the chain.
// The keys that stay and the new ones are merged in one pass, and the
// place of each new key found in one pass back, so that a chain of many
// keys costs what it holds.
func (b *builder) placeKeyed(t Table, st *tableState, chain string, k *txKeyed) error {
	final := &keyedChain{}
	var stay []*keyedEntry
	if old := st.keyed[chain]; old != nil && !k.reset {
		stay = old.entries
	}
	keys := sortedKeys(k.set)
	final.entries = make([]*keyedEntry, 0, len(stay)+len(keys))
	for len(stay) > 0 || len(keys) > 0 {
		if len(stay) > 0 {
			if _, changed := k.set[stay[0].key]; changed {
				stay = stay[1:]
				continue
			}
		}
		if len(keys) > 0 && len(k.set[keys[0]]) == 0 {
			keys = keys[1:]
			continue
		}
		if len(keys) == 0 || (len(stay) > 0 && stay[0].key < keys[0]) {
			final.entries = append(final.entries, stay[0])
			stay = stay[1:]
			continue
		}
		key := keys[0]
		keys = keys[1:]
		final.entries = append(final.entries, &keyedEntry{key: key, handles: make([]uint64, len(k.set[key])), fresh: true})
	}
	// Where each new key's rules go: before the next key that stays.
	pos := make([]position, len(final.entries))
	next := position{}
	for i := len(final.entries) - 1; i >= 0; i-- {
		pos[i] = next
		if e := final.entries[i]; !e.fresh && len(e.handles) > 0 {
			next = position{kind: posBeforeHandle, handle: e.handles[0]}
		}
	}
	var added []*keyedEntry
	for i, e := range final.entries {
		if !e.fresh {
			continue
		}
		added = append(added, e)
		rules := k.set[e.key]
		b.m.b.SetOwner(k.owners[e.key])
		e.sigs = make([]uint64, len(rules))
		for j := range rules {
			sig, err := b.addRule(t, chain, &rules[j], pos[i], &e.handles[j])
			if err != nil {
				return err
			}
			e.sigs[j] = sig
		}
	}
	b.onSuccess = append(b.onSuccess, func() {
		for _, e := range added {
			e.fresh = false
		}
		st.keyed[chain] = final
	})
	return nil
}

// dropJumps deletes the owner's rules in a builtin chain unless they are
// already exactly the wanted ones.
func (b *builder) dropJumps(t Table, st *tableState, chain string, rules []Rule) {
	blk := st.jumps[chain]
	if blk == nil {
		return
	}
	if sameSigs(blk.sigs, sigsOf(t.Family, rules)) {
		return
	}
	for _, h := range blk.handles {
		b.m.delRule(t, chain, h)
	}
}

// placeJumps inserts the wanted rules at the top of a builtin chain, in
// order, unless they are there already.
func (b *builder) placeJumps(t Table, st *tableState, chain string, rules []Rule) error {
	if blk := st.jumps[chain]; blk != nil && sameSigs(blk.sigs, sigsOf(t.Family, rules)) {
		return nil
	}
	blk := &ruleBlock{sigs: make([]uint64, len(rules)), handles: make([]uint64, len(rules))}
	for i := len(rules) - 1; i >= 0; i-- {
		sig, err := b.addRule(t, chain, &rules[i], position{kind: posHead}, &blk.handles[i])
		if err != nil {
			return err
		}
		blk.sigs[i] = sig
	}
	b.onSuccess = append(b.onSuccess, func() {
		if len(rules) == 0 {
			delete(st.jumps, chain)
		} else {
			st.jumps[chain] = blk
		}
	})
	return nil
}
