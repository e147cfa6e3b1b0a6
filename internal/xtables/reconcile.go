//go:build linux

package xtables

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// kernelTable is one table as the kernel lists it, seen from an owner.
type kernelTable struct {
	st *tableState
	// rules are the rules of owned and builtin chains, in order.
	rules map[string][]dumpedRule
	// referenced are owned chains that rules of foreign chains jump to:
	// they cannot be deleted.
	referenced map[string]bool
}

// tableUse returns whether table t exists and its use count.
func (a *Applier) tableUse(ctx context.Context, t Table) (bool, uint32, error) {
	tables, err := a.conn.Tables(ctx, nfnl.Family(t.Family))
	if err != nil {
		return false, 0, fmt.Errorf("list %s tables: %w", t.Family, err)
	}
	for _, tab := range tables {
		if tab.Name == string(t.Name) {
			return true, tab.Use, nil
		}
	}
	return false, 0, nil
}

// dumpAttempts bounds the dumps of one chain that another writer's
// commits interrupt: a chain's dump is short, so that another attempt
// soon finds a gap between commits, where the dump of a whole table would
// keep losing.
const dumpAttempts = 8

// dumpRules lists the rules of table t, or of one chain of it.
func (a *Applier) dumpRules(ctx context.Context, t Table, chain string) ([]dumpedRule, error) {
	var out []dumpedRule
	var err error
	for range dumpAttempts {
		out = out[:0]
		var s signer
		err = a.conn.EachRule(ctx, nfnl.Family(t.Family), string(t.Name), chain, func(r *nfnl.Rule) error {
			d, err := s.fromDump(r)
			out = append(out, d)
			return err
		})
		if !errors.Is(err, nfnl.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list rules of %s %s: %w", t, chain, err)
	}
	return out, nil
}

// perChainDump is the number of chains above which a table's rules are
// read chain by chain: the kernel resumes a dump of a whole table by
// walking it from the start again for every message it fills, so the
// cost of one dump grows with the square of the table's size, while each
// chain's dump costs about the same small amount.
const perChainDump = 2000

// dumpTable lists the rules of every chain of table t.
func (a *Applier) dumpTable(ctx context.Context, t Table, chains []nfnl.Chain) ([]dumpedRule, error) {
	if len(chains) <= perChainDump {
		return a.dumpRules(ctx, t, "")
	}
	var out []dumpedRule
	for _, c := range chains {
		rules, err := a.dumpRules(ctx, t, c.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, rules...)
	}
	return out, nil
}

// load reads table t: its existence, builtin and owned chains, and the
// rules of builtin and owned chains.
func (a *Applier) load(ctx context.Context, t Table) (*kernelTable, error) {
	k := &kernelTable{st: newTableState(), rules: map[string][]dumpedRule{}, referenced: map[string]bool{}}
	exists, use, err := a.tableUse(ctx, t)
	if err != nil || !exists {
		return k, err
	}
	k.st.exists, k.st.use = true, use
	chains, err := a.conn.Chains(ctx, nfnl.Family(t.Family), string(t.Name))
	if errors.Is(err, nfnl.ErrDumpInterrupted) && chains != nil {
		// Another writer committed while the chains were listed, most
		// often to another table. The listing holds exactly the table's
		// chains when their number is the table's object count, before
		// and after: a commit that added or removed one of them would
		// have moved it (iptables-nft's tables hold chains alone).
		if _, after, uerr := a.tableUse(ctx, t); uerr == nil && after == use && uint32(len(chains)) == use {
			err = nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list chains of %s: %w", t, err)
	}
	for _, c := range chains {
		switch {
		case c.Hook != nil:
			k.st.base[c.Name] = IsBaseChain(t.Name, c.Name)
		case a.owns(t.Name, c.Name):
			k.st.chains[c.Name] = true
		}
	}
	rules, err := a.dumpTable(ctx, t, chains)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		switch {
		case a.owns(t.Name, r.chain) || IsBaseChain(t.Name, r.chain):
			k.rules[r.chain] = append(k.rules[r.chain], r)
		case r.jumpsTo != "" && a.owns(t.Name, r.jumpsTo):
			k.referenced[r.jumpsTo] = true
		}
	}
	return k, nil
}

// Reconcile reads what the kernel holds in the tables of want and makes
// it match want in one batch, sending only what differs: chains whose
// rules differ are rewritten, missing ones created, owned chains not
// wanted deleted, jumps restored. Afterwards the Applier knows the
// kernel's state and Commit may run. A concurrent change by someone else
// makes it start over, a few times at most.
func (a *Applier) Reconcile(ctx context.Context, want map[Table]*TableContent) (CommitStats, error) {
	var err error
	for range 3 {
		var stats CommitStats
		stats, err = a.reconcileOnce(ctx, want)
		if !errors.Is(err, ErrGenChanged) {
			return stats, err
		}
	}
	return CommitStats{}, err
}

// Verify reports whether the kernel holds exactly want in its tables:
// whether a Reconcile would send nothing. It reads the tables back, unless
// no one but the Applier committed since they were last read whole, and it
// changes nothing in the kernel.
func (a *Applier) Verify(ctx context.Context, want map[Table]*TableContent) (bool, error) {
	g, err := a.conn.Generation(ctx)
	if err != nil {
		return false, fmt.Errorf("read generation: %w", err)
	}
	if a.loaded && !a.foreign && g.ID == a.gen {
		return true, nil
	}
	tx := NewTx()
	for _, t := range sortedTables(want) {
		k, err := a.load(ctx, t)
		if err != nil {
			return false, err
		}
		if err := a.diff(t, k, want[t], tx); err != nil {
			return false, err
		}
	}
	if tx.Changes() {
		return false, nil
	}
	if a.loaded && g.ID == a.gen {
		a.foreign = false
	}
	return true, nil
}

func (a *Applier) reconcileOnce(ctx context.Context, want map[Table]*TableContent) (CommitStats, error) {
	gen, err := a.conn.Generation(ctx)
	if err != nil {
		return CommitStats{}, fmt.Errorf("read generation: %w", err)
	}
	tables := map[Table]*tableState{}
	tx := NewTx()
	for _, t := range sortedTables(want) {
		k, err := a.load(ctx, t)
		if err != nil {
			return CommitStats{}, err
		}
		tables[t] = k.st
		if err := a.diff(t, k, want[t], tx); err != nil {
			return CommitStats{}, err
		}
	}
	a.tables, a.gen, a.loaded, a.foreign = tables, gen.ID, true, false
	// Another writer's commit elsewhere while the tables were read must
	// not cost the reconcile: when the generation moved, check cheaply
	// that the tables are as read, and commit at the new generation.
	if ok, err := a.Check(ctx); err != nil || !ok {
		return CommitStats{}, errors.Join(ErrGenChanged, err)
	}
	return a.Commit(ctx, tx)
}

// diff records in tx what makes kernel table k hold want, and fills k.st
// with what stays as it is.
func (a *Applier) diff(t Table, k *kernelTable, want *TableContent, tx *Tx) error {
	tx.Touch(t)
	for name, rules := range want.Chains {
		if !k.st.chains[name] || !sameSigs(dumpedSigs(k.rules[name]), sigsOf(t.Family, rules)) {
			tx.SetOwner(want.ChainOwners[name])
			tx.SetChain(t, name, rules)
		}
	}
	for chain, keys := range want.Keyed {
		if kc, ok := adoptKeyed(t.Family, k.rules[chain], keys); ok && k.st.chains[chain] {
			k.st.keyed[chain] = kc
			continue
		}
		tx.ResetKeyed(t, chain)
		for key, rules := range keys {
			tx.SetOwner(want.KeyOwners[key])
			tx.SetKeyed(t, chain, key, rules)
		}
	}
	tx.SetOwner(nil)
	inParts := a.diffParts(t, k, want.Parts, tx)
	for name := range k.st.chains {
		_, whole := want.Chains[name]
		_, keyed := want.Keyed[name]
		switch {
		case whole || keyed || inParts[name]:
		case k.referenced[name]:
			a.log.Warn("chain no longer wanted is still used by a foreign rule; flushed and left in place", "table", t.String(), "chain", name)
			if len(k.rules[name]) > 0 {
				tx.SetChain(t, name, nil)
			}
		default:
			tx.DeleteChain(t, name)
		}
	}
	for _, bc := range BaseChains(t.Name) {
		a.diffJumps(t, k, bc.Name, want.Jumps[bc.Name], tx)
	}
	return nil
}

// diffParts records in tx the chains of parts that kernel table k does
// not hold as they should be, and returns those of its chains that parts
// holds. When the kernel holds none of the owner's chains, nothing needs
// comparing: every chain is written.
func (a *Applier) diffParts(t Table, k *kernelTable, parts iter.Seq2[any, []Chain], tx *Tx) map[string]bool {
	if parts == nil {
		return nil
	}
	p := &txParts{seq: parts, same: map[string]bool{}}
	write := false
	if len(k.st.chains) == 0 {
		for _, group := range parts {
			if write = len(group) > 0; write {
				break
			}
		}
		if write {
			tx.table(t).parts = p
		}
		return nil
	}
	held := map[string]bool{}
	for owner, group := range parts {
		for _, c := range group {
			if !k.st.chains[c.Name] {
				write = true
				continue
			}
			held[c.Name] = true
			if sameSigs(dumpedSigs(k.rules[c.Name]), sigsOf(t.Family, c.Rules)) {
				p.same[c.Name] = true
			} else {
				p.flush = append(p.flush, ownedChain{c.Name, owner})
				write = true
			}
		}
	}
	if write {
		slices.SortFunc(p.flush, func(x, y ownedChain) int { return strings.Compare(x.name, y.name) })
		tx.table(t).parts = p
	}
	return held
}

// diffJumps adopts the owner's rules in a builtin chain when they are
// exactly the wanted ones at its top, else has them rewritten.
func (a *Applier) diffJumps(t Table, k *kernelTable, chain string, want []Rule, tx *Tx) {
	all := k.rules[chain]
	blk := &ruleBlock{}
	top := true
	for i, r := range all {
		if r.jumpsTo == "" || !a.owns(t.Name, r.jumpsTo) {
			continue
		}
		top = top && i == len(blk.handles)
		blk.sigs = append(blk.sigs, r.sig)
		blk.handles = append(blk.handles, r.handle)
	}
	if len(blk.handles) > 0 {
		k.st.jumps[chain] = blk
	}
	if top && sameSigs(blk.sigs, sigsOf(t.Family, want)) {
		return
	}
	if len(blk.handles) > 0 {
		blk.sigs = make([]uint64, len(blk.sigs)) // never equal: rewrite
	}
	if len(want) > 0 || len(blk.handles) > 0 {
		tx.SetJumps(t, chain, want)
	}
}

func dumpedSigs(rules []dumpedRule) []uint64 {
	out := make([]uint64, len(rules))
	for i, r := range rules {
		out[i] = r.sig
	}
	return out
}

// adoptKeyed returns the keyed chain state for dumped rules that are
// exactly keys' rules in key order.
func adoptKeyed(f Family, dumped []dumpedRule, keys map[string][]Rule) (*keyedChain, bool) {
	kc := &keyedChain{}
	i := 0
	for _, key := range sortedKeys(keys) {
		rules := keys[key]
		if len(rules) == 0 {
			continue
		}
		sigs := sigsOf(f, rules)
		if i+len(sigs) > len(dumped) || !sameSigs(dumpedSigs(dumped[i:i+len(sigs)]), sigs) {
			return nil, false
		}
		e := &keyedEntry{key: key, sigs: sigs}
		for _, r := range dumped[i : i+len(sigs)] {
			e.handles = append(e.handles, r.handle)
		}
		kc.entries = append(kc.entries, e)
		i += len(sigs)
	}
	return kc, i == len(dumped)
}

// Check reports whether the kernel still holds what the Applier wrote, as
// far as cheap checks can tell: nothing changed at all (the generation is
// the one of the last commit), or the only changes left the tables' chain
// counts and the owner's jumps in builtin chains as they were. A false
// answer means Reconcile should run.
func (a *Applier) Check(ctx context.Context) (bool, error) {
	if !a.loaded {
		return false, nil
	}
	g, err := a.conn.Generation(ctx)
	if err != nil {
		return false, fmt.Errorf("read generation: %w", err)
	}
	gen := g.ID
	if gen == a.gen {
		return true, nil
	}
	a.foreign = true
	for _, t := range sortedTables(a.tables) {
		ok, err := a.checkTable(ctx, t, a.tables[t])
		if err != nil || !ok {
			return false, err
		}
	}
	a.gen = gen
	return true, nil
}

func (a *Applier) checkTable(ctx context.Context, t Table, st *tableState) (bool, error) {
	exists, use, err := a.tableUse(ctx, t)
	if err != nil || exists != st.exists || use != st.use {
		a.log.Debug("table changed", "table", t.String(), "exists", exists, "use", use, "want", st.use)
		return false, err
	}
	if !exists {
		return true, nil
	}
	for _, bc := range BaseChains(t.Name) {
		rules, err := a.dumpRules(ctx, t, bc.Name)
		if err != nil {
			return false, err
		}
		blk := st.jumps[bc.Name]
		var n int
		for i, r := range rules {
			if r.jumpsTo == "" || !a.owns(t.Name, r.jumpsTo) {
				continue
			}
			if blk == nil || i != n || n >= len(blk.handles) || r.handle != blk.handles[n] || r.sig != blk.sigs[n] {
				return false, nil
			}
			n++
		}
		if blk != nil && n != len(blk.handles) {
			a.log.Debug("jumps changed", "table", t.String(), "chain", bc.Name)
			return false, nil
		}
	}
	return true, nil
}

// Cleanup removes from tables everything the owner owns: its rules in
// builtin chains and its chains. Chains that foreign rules still jump to
// are flushed but kept, and reported. Tables and builtin chains stay.
// Afterwards the Applier knows nothing, as after NewApplier.
func (a *Applier) Cleanup(ctx context.Context, tables []Table) error {
	var err error
	for range 3 {
		if err = a.cleanupOnce(ctx, tables); !errors.Is(err, ErrGenChanged) {
			break
		}
	}
	a.tables, a.loaded = map[Table]*tableState{}, false
	return err
}

func (a *Applier) cleanupOnce(ctx context.Context, tables []Table) error {
	gen, err := a.conn.Generation(ctx)
	if err != nil {
		return fmt.Errorf("read generation: %w", err)
	}
	var m msgWriter
	var kept []string
	for _, t := range tables {
		k, err := a.load(ctx, t)
		if err != nil {
			return err
		}
		for _, bc := range BaseChains(t.Name) {
			for _, r := range k.rules[bc.Name] {
				if r.jumpsTo != "" && a.owns(t.Name, r.jumpsTo) {
					m.delRule(t, bc.Name, r.handle)
				}
			}
		}
		chains := sortedKeys(k.st.chains)
		for _, name := range chains {
			m.flushChain(t, name)
		}
		for _, name := range chains {
			if k.referenced[name] {
				kept = append(kept, t.String()+" "+name)
				continue
			}
			m.delChain(t, name)
		}
	}
	if m.count() > 0 {
		m.b.RequireGeneration(gen.ID)
		if _, err := a.conn.Commit(ctx, &m.b); err != nil {
			return fmt.Errorf("cleanup: %w", err)
		}
	}
	if len(kept) > 0 {
		slices.Sort(kept)
		return fmt.Errorf("cleanup: chains still used by foreign rules were flushed but kept: %v", kept)
	}
	return nil
}
