//go:build linux

package ipvs

import (
	"context"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// engine is the Proxier's side of internal/syncer's Engine. The
// Engine calls it with p.mu held.
type engine Proxier

// Check looks up the dummy link and reads the helper rules' generation;
// helper rules someone changed are restored at once.
func (e *engine) Check(ctx context.Context) (bool, error) {
	p := (*Proxier)(e)
	if p.model == nil {
		return false, nil
	}
	return p.check(ctx, false)
}

// Verify also reads the link's addresses, the virtual servers with their
// real servers and the sets' headers: reads in proportion to the
// services, nothing sent.
func (e *engine) Verify(ctx context.Context) (bool, error) {
	return (*Proxier)(e).check(ctx, true)
}

// Write reads the kernel and converges on st.
func (e *engine) Write(ctx context.Context, st *servicelb.State) error {
	p := (*Proxier)(e)
	p.forget()
	return p.syncFull(ctx, st)
}

// Apply applies the changes; a node change converges in full.
func (e *engine) Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	if ch.NodeChanged {
		return true, e.Write(ctx, st)
	}
	return false, (*Proxier)(e).syncChanges(ctx, st, ch)
}

// syncFull plans st in full and converges on it, reading the kernel first
// unless its state is known. Nothing changes until the plan has passed
// every check.
func (p *Proxier) syncFull(ctx context.Context, st *servicelb.State) error {
	plan, err := buildModel(st, &p.opts)
	if err != nil {
		return err
	}
	read := p.model == nil
	if read {
		foreign, err := p.readKernel(ctx)
		if err != nil {
			return err
		}
		if err := checkForeign(plan, foreign); err != nil {
			return err
		}
	}
	d := p.fullDelta(plan, read)
	if err := p.checkNew(ctx, d); err != nil {
		return err
	}
	if err := p.prepare(ctx, read); err != nil {
		p.forget()
		return err
	}
	p.nodeIP = plan.env.nodeIPs
	node := st.Node()
	if err := p.apply(ctx, d, func() error { return p.reconcileRules(ctx, &node, plan) }); err != nil {
		p.forget()
		return err
	}
	p.model = plan
	return nil
}

// syncChanges applies the changes from the applied state to st.
func (p *Proxier) syncChanges(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) error {
	s, err := p.model.plan(ch)
	if err != nil {
		return err
	}
	d := p.model.delta(s)
	if err := p.checkNew(ctx, d); err != nil {
		return err
	}
	if err := p.apply(ctx, d, func() error { return p.commitRules(ctx, d) }); err != nil {
		p.forget()
		return err
	}
	p.model.commit(s)
	return nil
}
