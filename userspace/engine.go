//go:build linux

package userspace

import (
	"context"
	"errors"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// engine is the Proxier as internal/syncer drives it. Its state is the
// proxy's own: Check and Verify look at the listeners and the held
// addresses, Write and Apply open and close listeners, point them at new
// decisions and hold and release addresses.
type engine Proxier

// Check reports whether every listener still serves and the last sync
// finished.
func (e *engine) Check(context.Context) (bool, error) {
	return e.broken.Load() == 0 && !e.dirty.Load(), nil
}

// Verify also reads the link's addresses back.
func (e *engine) Verify(ctx context.Context) (bool, error) {
	if ok, err := e.Check(ctx); !ok || err != nil || e.held == nil {
		return ok, err
	}
	return e.held.matches(ctx)
}

// Write serves st whatever is served now: it reopens failed listeners
// and reconciles the held addresses with the link's.
func (e *engine) Write(ctx context.Context, st *servicelb.State) error {
	p := (*Proxier)(e)
	p.dirty.Store(true)
	p.setNode(st.Node())
	if p.held != nil {
		if err := p.held.ensureLink(ctx); err != nil {
			return err
		}
		if p.o.StrictARP {
			if err := p.ensureStrictARP(); err != nil {
				return err
			}
		}
	}
	var removed []*portState
	for k, ps := range p.ports {
		if st.Port(k) == nil {
			removed = append(removed, ps)
		}
	}
	p.broken.Store(0)
	err := p.reconcile(ctx, st.Ports(), removed, true)
	if p.held != nil {
		err = errors.Join(err, p.held.reconcile(ctx))
	}
	p.settle(err)
	return err
}

// Apply serves the ports ch adds and changes and stops serving those it
// removes; a change of the node writes the whole state.
func (e *engine) Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	if ch.NodeChanged {
		return true, e.Write(ctx, st)
	}
	p := (*Proxier)(e)
	p.dirty.Store(true)
	want := slices.Clone(ch.Added)
	for _, c := range ch.Changed {
		want = append(want, c.New)
	}
	var removed []*portState
	for _, sp := range ch.Removed {
		if ps := p.ports[sp.Key]; ps != nil {
			removed = append(removed, ps)
		}
	}
	err := p.reconcile(ctx, want, removed, false)
	p.settle(err)
	return false, err
}

// settle records the end of a sync: one that failed otherwise than by
// leaving services out makes the next sync write the whole state, since
// the proxy may have applied part of it.
func (p *Proxier) settle(err error) {
	p.dirty.Store(err != nil && servicelb.ServicesOf(err) == nil)
}

func (p *Proxier) setNode(n servicelb.NodeConfig) {
	p.nodeCfg = n
	p.node.Store(newNode(n))
}
