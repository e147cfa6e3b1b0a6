//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// engine is the Proxier's side of internal/syncer's Engine: what its
// table holds and how to change it. The Engine calls it with p.mu held.
type engine Proxier

// Check reports cheaply whether the table still holds what the Proxier
// wrote. After a commit of the Proxier's own that nobody else's followed
// (genOK) it reads nothing: the batch that follows requires the ruleset
// generation to be still that commit's (commit), so the kernel itself
// refuses it if anyone committed in between, and the sync's next attempt
// checks. Otherwise it checks the table's flags and the number of objects
// it holds, which a foreign commit anywhere else leaves as they were, and
// the rules of the node's few fixed chains (the base chains and the
// dispatch chain), which a flush of the table empties.
func (k *engine) Check(ctx context.Context) (bool, error) {
	k.presumed = k.genOK
	if k.genOK {
		return true, nil
	}
	g, err := k.conn.Generation(ctx)
	if err != nil {
		return false, err
	}
	k.seen = g.ID
	t, err := k.conn.Table(ctx, nfnl.Inet, k.opts.Table)
	switch {
	case errors.Is(err, nfnl.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case t.Flags != 0 || t.Use != k.use:
		return false, nil
	}
	if k.model != nil {
		// Each chain is one small dump, which another writer's commit
		// interrupts only in the moment between its two parts: read
		// again at once.
		lost := ""
		err := nl.RetryInterrupted(ctx, func() error {
			lost = ""
			for _, c := range k.model.node.chains {
				if c.hook == nil && c.name != chainServices {
					continue
				}
				rs, err := k.conn.RulesRaw(ctx, nfnl.Inet, k.opts.Table, c.name)
				if err != nil {
					return err
				}
				if len(rs) != len(c.rules) {
					k.log.Info("a fixed chain lost its rules", "chain", c.name, "rules", len(rs), "want", len(c.rules))
					lost = c.name
					return nil
				}
			}
			return nil
		})
		if err != nil || lost != "" {
			return false, err
		}
	}
	k.gen, k.genOK = g.ID, true
	return true, nil
}

// Verify reads the table back and compares every chain, rule, set and
// element with the model; it reads nothing when nobody committed since
// the last verify that found the table whole.
func (k *engine) Verify(ctx context.Context) (bool, error) {
	g, err := k.conn.Generation(ctx)
	if err != nil {
		return false, err
	}
	if k.verifiedOK && g.ID == k.verified {
		return true, nil
	}
	why, err := (*Proxier)(k).verify(ctx, k.plan.content(k.model))
	if err != nil {
		return false, fmt.Errorf("check table: %w", err)
	}
	if why != "" {
		k.log.Info("table differs from what was written", "difference", why)
		return false, nil
	}
	k.verified, k.verifiedOK = g.ID, true
	return true, nil
}

// Write replaces the table's content with st's in one transaction,
// adopting whatever table of that name exists.
func (k *engine) Write(ctx context.Context, st *servicelb.State) error {
	next, err := k.plan.build(st)
	if err != nil {
		return err
	}
	b, err := (*Proxier)(k).replaceBatch(ctx, next)
	if err != nil {
		return fmt.Errorf("read table: %w", err)
	}
	if err := k.commit(ctx, b, true); err != nil {
		return err
	}
	k.model, k.verifiedOK = next, false
	k.log.Debug("table written", "messages", b.Len(), "bytes", b.Size())
	return nil
}

// Apply writes what the changed service ports need, in one transaction.
func (k *engine) Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	s, err := k.plan.plan(k.model, ch, st)
	if err != nil {
		return false, err
	}
	b := &nfnl.Batch{}
	d := s.delta(k.model)
	if err := d.batch(k.opts.Table, b); err != nil {
		return false, err
	}
	err = k.commit(ctx, b, d.objects())
	if errors.Is(err, nfnl.ErrGenerationChanged) && k.presumed {
		// Someone committed since the Proxier's last commit, which Check
		// took on trust: check now, and send the batch again if the table
		// is as the Proxier left it.
		ok, cerr := k.Check(ctx)
		switch {
		case cerr != nil:
			return false, cerr
		case ok:
			err = k.commit(ctx, b, d.objects())
		}
	}
	if err != nil {
		return false, err
	}
	s.apply(k.model)
	k.log.Debug("applied changes", "added", len(ch.Added), "removed", len(ch.Removed),
		"changed", len(ch.Changed), "node", ch.NodeChanged, "messages", b.Len())
	return false, nil
}

// commit sends b and records what the table holds after it: the
// generation, known to be the Proxier's own when it follows the one the
// batch started from (nobody committed in between), and, when b adds or
// deletes chains or sets (objects), the table's object count, for the
// next cheap check. Elements and rules leave the count as it was, so a
// change of elements alone costs no read.
//
// When the sync's check took the table on trust (presumed: the Proxier's
// own commit was the last), b requires the generation to be still that
// commit's: if anyone committed since, the kernel refuses b with
// ErrGenerationChanged, and the sync checks and sends it again. After a
// check that read the table, b requires nothing: a foreign commit between
// that check and b is no different from one just after b, which the next
// sync's check reads (the generation then does not follow the one checked),
// and b names every object it touches, never a rule's handle, so it means
// the same whatever else the ruleset holds. Requiring the generation
// there would only lose, over and over, to a writer that commits more
// often than a check takes.
func (k *engine) commit(ctx context.Context, b *nfnl.Batch, objects bool) error {
	if b.Len() == 0 {
		return nil
	}
	from := k.seen
	if k.genOK && k.presumed {
		b.RequireGeneration(k.gen)
		from = k.gen
	}
	after, err := k.conn.Commit(ctx, b)
	if errors.Is(err, nfnl.ErrGenerationChanged) {
		k.genOK = false
	}
	if err != nil {
		return err
	}
	k.gen, k.genOK = after.ID, after.ID == from+1
	if !objects {
		return nil
	}
	t, err := k.conn.Table(ctx, nfnl.Inet, k.opts.Table)
	if err != nil {
		return fmt.Errorf("read table after commit: %w", err)
	}
	k.use = t.Use
	return nil
}
