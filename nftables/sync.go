package nftables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// sync is one attempt at Sync: look at the generation, decide between an
// incremental change and a full rewrite, commit, and remember the result.
func (p *Proxier) sync(ctx context.Context, st *servicelb.State) error {
	gen, err := p.conn.Generation(ctx)
	if err != nil {
		return fmt.Errorf("nftables: sync: %w", err)
	}
	full, err := p.needRewrite(ctx, gen.ID)
	if err != nil {
		return err
	}
	if full {
		return p.rewrite(ctx, st, gen.ID)
	}
	changes := servicelb.Diff(p.applied, st)
	if changes.Empty() {
		p.gen, p.genOK = gen.ID, true
		return nil
	}
	s, err := p.plan.plan(p.model, &changes, st)
	if err != nil {
		return err
	}
	b := &nfnl.Batch{}
	if err := s.delta(p.model).batch(p.opts.Table, b); err != nil {
		return fmt.Errorf("nftables: sync: %w", err)
	}
	if err := p.commit(ctx, b, gen.ID); err != nil {
		return err
	}
	s.apply(p.model)
	if !p.opts.NoConntrackCleanup {
		p.stale.refresh(&changes)
		p.stale.add(changes.StaleFlows())
	}
	p.applied = st
	p.log.Debug("applied changes", "added", len(changes.Added), "removed", len(changes.Removed),
		"changed", len(changes.Changed), "node", changes.NodeChanged, "messages", b.Len())
	return nil
}

// needRewrite reports whether the next sync must rewrite the whole table:
// on the first sync, and when someone else committed since our last commit
// and the table no longer holds what we wrote.
func (p *Proxier) needRewrite(ctx context.Context, gen uint32) (bool, error) {
	if p.model == nil {
		return true, nil
	}
	if p.genOK && gen == p.gen {
		return false, nil
	}
	why, err := p.verify(ctx, p.plan.content(p.model))
	if err != nil {
		return false, fmt.Errorf("nftables: sync: check table: %w", err)
	}
	if why != "" {
		p.log.Info("table changed by another writer; rewriting it", "difference", why)
		return true, nil
	}
	p.gen, p.genOK = gen, true
	return false, nil
}

// rewrite replaces the table's content with st's in one transaction. The
// flows in conntrack may then be anyone's (an earlier process's, or from
// before someone changed the table): every UDP and SCTP frontend of st is
// reconciled with its serving endpoints.
func (p *Proxier) rewrite(ctx context.Context, st *servicelb.State, gen uint32) error {
	next, err := p.plan.build(st)
	if err != nil {
		return err
	}
	b, err := p.replaceBatch(ctx, p.plan.content(next))
	if err != nil {
		return fmt.Errorf("nftables: sync: read table: %w", err)
	}
	if err := p.commit(ctx, b, gen); err != nil {
		return err
	}
	if p.applied == nil {
		p.log.Info("table written", "services", st.Len(), "messages", b.Len(), "bytes", b.Size())
	}
	if !p.opts.NoConntrackCleanup {
		p.stale.reset(st)
	}
	p.model, p.applied = next, st
	return nil
}

// commit sends b, on the condition that the generation is still gen, and
// records the generation it leaves.
func (p *Proxier) commit(ctx context.Context, b *nfnl.Batch, gen uint32) error {
	if b.Len() == 0 {
		p.gen, p.genOK = gen, true
		return nil
	}
	b.RequireGeneration(gen)
	after, err := p.conn.Commit(ctx, b)
	if err != nil {
		return fmt.Errorf("nftables: sync: %w", err)
	}
	// Anything but the next generation means someone else committed right
	// after us: check the table on the next sync.
	p.gen, p.genOK = after.ID, after.ID == gen+1
	return nil
}

// cleanFlows deletes the stale conntrack flows of the syncs so far. The
// filters stay pending until a deletion succeeds.
func (p *Proxier) cleanFlows(ctx context.Context) error {
	if p.stale.empty() {
		return nil
	}
	fs := p.stale.list()
	n, err := p.opts.Conntrack.DeleteStale(ctx, fs)
	if err != nil {
		return fmt.Errorf("nftables: delete stale conntrack flows (retried on the next sync): %w", err)
	}
	p.log.Debug("deleted stale flows", "filters", len(fs), "flows", n)
	p.stale.clear()
	return nil
}
