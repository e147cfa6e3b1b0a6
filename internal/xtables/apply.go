//go:build linux

package xtables

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"sort"
)

// ErrNotLoaded reports a Commit before the Applier has read the kernel's
// state with Reconcile (or after a failure made that state unknown).
var ErrNotLoaded = errors.New("kernel state not loaded: reconcile first")

// Applier keeps the chains its owner owns in iptables-nft tables as its
// owner asks, one nf_tables batch per change, and remembers what it wrote
// so that each change costs what it changes.
//
// It owns the user chains its Owns function accepts and, in builtin
// chains, the rules that jump to them. It creates tables and builtin
// chains when they are missing, as iptables-nft does, and never deletes or
// flushes them; every other chain and rule is left alone.
//
// There are three kinds of content. A whole chain is written in full when
// it changes (flushed, then filled). A keyed chain holds rules of many
// owners, each under a key, kept in key order; changing one key deletes
// and inserts only that key's rules, placing them by rule handle. Jumps are
// the owner's rules at the top of a builtin chain.
//
// An Applier is not safe for concurrent use.
type Applier struct {
	conn   Conn
	owns   func(TableName, string) bool
	log    *slog.Logger
	tables map[Table]*tableState
	gen    uint32
	loaded bool
	// foreign: someone else committed since the tables were last read
	// whole (Reconcile, Verify), so that only a Verify that reads them
	// can vouch for their rules.
	foreign bool
}

// ApplierOptions configure an Applier.
type ApplierOptions struct {
	Conn Conn
	// Owns reports whether a user chain belongs to the owner.
	Owns func(table TableName, chain string) bool
	// Logger receives per-commit detail at Debug; nil discards.
	Logger *slog.Logger
}

// NewApplier returns an Applier. It reads nothing until Reconcile.
func NewApplier(o ApplierOptions) *Applier {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Applier{conn: o.Conn, owns: o.Owns, log: log, tables: map[Table]*tableState{}}
}

// tableState is what the Applier knows the kernel holds in one table.
type tableState struct {
	exists bool
	base   map[string]bool
	chains map[string]bool // owned user chains present
	keyed  map[string]*keyedChain
	jumps  map[string]*ruleBlock // by builtin chain
	// use is the table's use count (chains, sets, objects) as of the
	// last commit; a change means someone else added or removed some.
	use uint32
}

func newTableState() *tableState {
	return &tableState{base: map[string]bool{}, chains: map[string]bool{},
		keyed: map[string]*keyedChain{}, jumps: map[string]*ruleBlock{}}
}

// keyedChain is a keyed chain's rules, grouped by key in key order.
type keyedChain struct {
	entries []*keyedEntry
}

type keyedEntry struct {
	key     string
	sigs    []uint64
	handles []uint64
	fresh   bool // being placed by the commit under way
}

// find returns the index of key's entry, or where it would go.
func (k *keyedChain) find(key string) (int, bool) {
	return sort.Find(len(k.entries), func(i int) int { return cmp.Compare(key, k.entries[i].key) })
}

// ruleBlock is the owner's rules in a builtin chain.
type ruleBlock struct {
	sigs    []uint64
	handles []uint64
}

// TableContent is everything an owner wants in one table.
type TableContent struct {
	// Chains are whole chains.
	Chains map[string][]Rule
	// Parts are more whole chains, in groups made on demand instead of
	// held, so that the chains of a large table need not all exist at
	// once beside their encoding: Reconcile and Verify range over Parts,
	// again on every attempt, and keep no group past its yield (the
	// producer may reuse a group's chains and rules for the next). A group's
	// chains are all created before any of their rules is written, so its
	// rules may jump to its own chains, to Chains and keyed chains, and to
	// the chains of earlier groups. A chain name appears once in Chains
	// and Parts together. Each group comes with its owner, whose its
	// chains are, as ChainOwners says of Chains.
	Parts iter.Seq2[any, []Chain]
	// Keyed are keyed chains: chain, then key, then the key's rules.
	Keyed map[string]map[string][]Rule
	// Jumps are the owner's rules at the top of builtin chains.
	Jumps map[string][]Rule
	// ChainOwners and KeyOwners say whose whole chains and the keys of
	// keyed chains are, by chain name and by key: what a refusal of the
	// kernel names (nfnl.Batch.SetOwner). Those they leave out, and the
	// jumps, are no one's.
	ChainOwners, KeyOwners map[string]any
}

// Whole returns the content's whole chains, those of Chains and copies of
// those Parts makes, by name.
func (c *TableContent) Whole() map[string][]Rule {
	out := maps.Clone(c.Chains)
	if out == nil {
		out = map[string][]Rule{}
	}
	if c.Parts != nil {
		for _, group := range c.Parts {
			for _, ch := range group {
				rules := slices.Clone(ch.Rules)
				for i := range rules {
					rules[i].Matches = slices.Clone(rules[i].Matches)
				}
				out[ch.Name] = rules
			}
		}
	}
	return out
}

// Text returns the content as a table to render as iptables-save text.
func (c *TableContent) Text(name TableName) *TableText {
	t := &TableText{Name: name, Base: c.Jumps}
	for n, rules := range c.Whole() {
		t.Chains = append(t.Chains, Chain{Name: n, Rules: rules})
	}
	for n, keys := range c.Keyed {
		t.Chains = append(t.Chains, Chain{Name: n, Rules: flattenKeyed(keys)})
	}
	return t
}

// flattenKeyed returns the rules of a keyed chain in key order.
func flattenKeyed(keys map[string][]Rule) []Rule {
	var out []Rule
	for _, k := range sortedKeys(keys) {
		out = append(out, keys[k]...)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Tx is a set of changes to commit in one batch. Its methods record the
// change and cannot fail; errors surface at Commit.
type Tx struct {
	tables map[Table]*txTable
	owner  any
}

type txTable struct {
	set   map[string][]Rule
	del   map[string]bool
	keyed map[string]*txKeyed
	jumps map[string][]Rule
	// owners holds the owners of the chains set or deleted.
	owners map[string]any
	parts  *txParts
}

// txParts are the chains of a TableContent's Parts to write: all but
// those the kernel holds as they should be (same), after flushing those
// it holds otherwise (flush, in name order).
type txParts struct {
	seq   iter.Seq2[any, []Chain]
	same  map[string]bool
	flush []ownedChain
}

// ownedChain is a chain's name and its owner.
type ownedChain struct {
	name  string
	owner any
}

type txKeyed struct {
	reset bool
	set   map[string][]Rule
	// owners holds the owners of the keys set.
	owners map[string]any
}

// Changes reports whether tx changes anything.
func (tx *Tx) Changes() bool {
	for _, tt := range tx.tables {
		if len(tt.set)+len(tt.del)+len(tt.keyed)+len(tt.jumps) > 0 || tt.parts != nil {
			return true
		}
	}
	return false
}

// sizeHint guesses the size of the batch for tx and its number of
// messages, to allocate both at once (the batch a chunk at most, so that
// a guess too big costs little): rules take up to about 1 KiB (a DNAT
// rule with comment and affinity). The chains of Parts are not counted.
func (tx *Tx) sizeHint() (bytes, msgs int) {
	for _, tt := range tx.tables {
		msgs += len(tt.set) + len(tt.del)
		for _, rules := range tt.set {
			msgs += len(rules)
			bytes += 1024 * len(rules)
		}
		for _, k := range tt.keyed {
			for _, rules := range k.set {
				msgs += len(rules)
				bytes += 1024 * len(rules)
			}
		}
	}
	return bytes + 64*msgs, msgs
}

// NewTx returns an empty transaction.
func NewTx() *Tx { return &Tx{tables: map[Table]*txTable{}} }

func (tx *Tx) table(t Table) *txTable {
	tt := tx.tables[t]
	if tt == nil {
		tt = &txTable{set: map[string][]Rule{}, del: map[string]bool{}, keyed: map[string]*txKeyed{}, jumps: map[string][]Rule{},
			owners: map[string]any{}}
		tx.tables[t] = tt
	}
	return tt
}

// Touch makes the commit create table t and its builtin chains if they
// are missing, even when nothing else changes in it.
func (tx *Tx) Touch(t Table) { tx.table(t) }

// SetOwner makes the chains and keys the next calls set or delete belong
// to owner (nil: to no one), until the next SetOwner: a refusal of the
// kernel names it (nfnl.Batch.SetOwner).
func (tx *Tx) SetOwner(owner any) { tx.owner = owner }

// own records the current owner of a chain or key.
func (tx *Tx) own(owners map[string]any, name string) {
	if tx.owner != nil {
		owners[name] = tx.owner
	} else {
		delete(owners, name)
	}
}

// SetChain makes chain name hold exactly rules, creating it if needed.
func (tx *Tx) SetChain(t Table, name string, rules []Rule) {
	tt := tx.table(t)
	delete(tt.del, name)
	tt.set[name] = rules
	tx.own(tt.owners, name)
}

// DeleteChain removes chain name if it exists.
func (tx *Tx) DeleteChain(t Table, name string) {
	tt := tx.table(t)
	delete(tt.set, name)
	tt.del[name] = true
	tx.own(tt.owners, name)
}

func (tt *txTable) keyedChain(name string) *txKeyed {
	k := tt.keyed[name]
	if k == nil {
		k = &txKeyed{set: map[string][]Rule{}, owners: map[string]any{}}
		tt.keyed[name] = k
	}
	return k
}

// SetKeyed makes key's rules in keyed chain chain exactly rules (none
// removes the key), creating the chain if needed.
func (tx *Tx) SetKeyed(t Table, chain, key string, rules []Rule) {
	k := tx.table(t).keyedChain(chain)
	k.set[key] = rules
	tx.own(k.owners, key)
}

// ResetKeyed makes keyed chain chain hold only the keys set in this
// transaction: it is flushed and written anew.
func (tx *Tx) ResetKeyed(t Table, chain string) {
	tx.table(t).keyedChain(chain).reset = true
}

// SetJumps makes rules the owner's rules in builtin chain chain, at its
// top; none removes them.
func (tx *Tx) SetJumps(t Table, chain string, rules []Rule) {
	tx.table(t).jumps[chain] = rules
}

// Gen returns the nf_tables generation the Applier last saw: the one its
// own last commit produced, or the one it read.
func (a *Applier) Gen() uint32 { return a.gen }

// Loaded reports whether the Applier knows the kernel's state, so that
// Commit may run.
func (a *Applier) Loaded() bool { return a.loaded }

// Commit applies tx in one batch. It sends nothing when tx changes
// nothing the kernel does not already hold. If it fails, the kernel is
// unchanged and the Applier forgets what it knew: the next change must
// start with Reconcile.
func (a *Applier) Commit(ctx context.Context, tx *Tx) (CommitStats, error) {
	if !a.loaded {
		return CommitStats{}, ErrNotLoaded
	}
	b := newBuilder()
	bytes, msgs := tx.sizeHint()
	b.m.b.Grow(bytes)
	b.m.b.GrowMessages(msgs)
	for _, t := range sortedTables(tx.tables) {
		st := a.tables[t]
		if st == nil {
			st = newTableState()
			a.tables[t] = st
		}
		if err := b.table(t, st, tx.tables[t]); err != nil {
			return CommitStats{}, err
		}
	}
	if b.m.count() == 0 {
		return CommitStats{}, nil
	}
	b.markEchoes()
	// Building a big batch takes a while; another writer's commit
	// elsewhere meanwhile must not cost this one: check cheaply that the
	// tables are as known, at the generation of now.
	if ok, err := a.Check(ctx); err != nil || !ok {
		return CommitStats{}, errors.Join(ErrGenChanged, err)
	}
	b.m.b.RequireGeneration(a.gen)
	stats := CommitStats{Messages: b.m.count(), Bytes: b.m.b.Size()}
	if _, err := a.conn.Commit(ctx, &b.m.b); err != nil {
		// A batch refused for a moved generation changed nothing: what
		// the Applier knows still holds, for a cheap check to confirm.
		if !errors.Is(err, ErrGenChanged) {
			a.loaded = false
		}
		return CommitStats{}, fmt.Errorf("commit: %w", err)
	}
	// The generation after our commit; Commit's own reading may already
	// include someone else's commit, which Check must still see.
	a.gen = nextGen(a.gen)
	for _, f := range b.onSuccess {
		f()
	}
	if err := b.learnHandles(); err != nil {
		a.loaded = false
		a.log.Warn("rule handles not learned; the next sync reloads", "err", err)
	}
	a.log.Debug("committed", "messages", stats.Messages, "bytes", stats.Bytes, "gen", a.gen)
	return stats, nil
}

// CommitStats describe a batch.
type CommitStats struct {
	Messages int
	Bytes    int
}

func nextGen(g uint32) uint32 {
	g++
	if g == 0 {
		g = 1
	}
	return g
}

func sortedTables[V any](m map[Table]V) []Table {
	ts := make([]Table, 0, len(m))
	for t := range m {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(x, y Table) int {
		return cmp.Or(cmp.Compare(x.Family, y.Family), cmp.Compare(x.Name, y.Name))
	})
	return ts
}

// builder turns a Tx into batch messages, counting the handles the kernel
// will hand out.
type builder struct {
	m         msgWriter
	onSuccess []func()
	pending   map[Table]*pendingTable
}

// pendingTable tracks, for one table, the rules whose handles the owner
// needs and the number of handles the batch allocates before each.
type pendingTable struct {
	allocs int
	rules  []pendingRule
}

type pendingRule struct {
	alloc int
	msg   int // index of the message in the batch
	slot  *uint64
}

func newBuilder() *builder { return &builder{pending: map[Table]*pendingTable{}} }

func (b *builder) pt(t Table) *pendingTable {
	p := b.pending[t]
	if p == nil {
		p = &pendingTable{}
		b.pending[t] = p
	}
	return p
}

// addRule writes a rule and, with slot, records where its handle goes. It
// returns the rule's signature.
func (b *builder) addRule(t Table, chain string, r *Rule, pos position, slot *uint64) (uint64, error) {
	enc, err := b.m.addRule(t, chain, r, pos)
	if err != nil {
		return 0, fmt.Errorf("%s chain %s: rule %q: %w", t, chain, r.AppendSave(nil, t.Family, chain), err)
	}
	p := b.pt(t)
	var sig uint64
	if slot != nil {
		p.rules = append(p.rules, pendingRule{alloc: p.allocs, msg: b.m.last(), slot: slot})
		if b.m.raw, err = splitExprs(b.m.raw[:0], enc); err == nil {
			sig, _, _ = rawSig(b.m.raw)
		}
	}
	p.allocs++
	return sig, nil
}

// markEchoes asks the kernel to echo the first and last rule of each
// table whose handle is needed: handles are allocated one by one in batch
// order, so two of them give all the others and check the count.
func (b *builder) markEchoes() {
	for _, p := range b.pending {
		if len(p.rules) > 0 {
			b.m.b.Echo(p.rules[0].msg)
			b.m.b.Echo(p.rules[len(p.rules)-1].msg)
		}
	}
}

// learnHandles fills in the handles of the pending rules from the echoed
// ones.
func (b *builder) learnHandles() error {
	var errs []error
	for t, p := range b.pending {
		if len(p.rules) == 0 {
			continue
		}
		first, last := p.rules[0], p.rules[len(p.rules)-1]
		r0, ok0 := b.m.b.Echoed(first.msg)
		r1, ok1 := b.m.b.Echoed(last.msg)
		if !ok0 || !ok1 {
			errs = append(errs, fmt.Errorf("%s: rules %d and %d not echoed", t, first.msg, last.msg))
			continue
		}
		base := r0.Handle - uint64(first.alloc)
		if r1.Handle != base+uint64(last.alloc) {
			errs = append(errs, fmt.Errorf("%s: handles %d and %d for allocations %d and %d", t, r0.Handle, r1.Handle, first.alloc, last.alloc))
			continue
		}
		for _, r := range p.rules {
			*r.slot = base + uint64(r.alloc)
		}
	}
	return errors.Join(errs...)
}
