//go:build linux

package iptables

import (
	"context"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// engine is the Proxier's side of internal/syncer's Engine: its chains and
// rules and how to change them. The Engine calls it with px.mu held.
type engine Proxier

// Check reports cheaply whether the tables still hold the Proxier's
// chains and jumps: when another writer committed, by the tables' object
// counts and the rules of the builtin chains.
func (k *engine) Check(ctx context.Context) (bool, error) {
	if !k.ap.Loaded() {
		return false, nil
	}
	return k.ap.Check(ctx)
}

// Verify reads every chain the Proxier owns back and compares its rules
// with the state last applied.
func (k *engine) Verify(ctx context.Context) (bool, error) {
	want, err := (*Proxier)(k).content(k.eng.Applied())
	if err != nil {
		return false, err
	}
	return k.ap.Verify(ctx, want)
}

// Write makes the tables hold st, sending only what differs from what
// they hold.
func (k *engine) Write(ctx context.Context, st *servicelb.State) error {
	px := (*Proxier)(k)
	if err := px.checkPorts(st.Ports()...); err != nil {
		return err
	}
	if err := px.routeLocalnet(st); err != nil {
		return err
	}
	want, err := px.content(st)
	if err != nil {
		return err
	}
	stats, err := k.ap.Reconcile(ctx, want)
	if err != nil {
		return err
	}
	k.log.Debug("reconciled", "services", st.Len(), "messages", stats.Messages, "bytes", stats.Bytes)
	return nil
}

// Apply applies the changes in one batch; a node change rewrites the
// whole state. A batch refused because another writer committed in
// between is tried again by the Engine, after a cheap check.
func (k *engine) Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	px := (*Proxier)(k)
	if err := px.checkChanges(ch); err != nil {
		return false, err
	}
	if ch.NodeChanged {
		return true, k.Write(ctx, st)
	}
	tx := xtables.NewTx()
	if err := px.changes(st, ch, tx); err != nil {
		return false, err
	}
	stats, err := k.ap.Commit(ctx, tx)
	if err != nil {
		return false, err
	}
	k.log.Debug("committed", "ports", ch.Len(), "messages", stats.Messages, "bytes", stats.Bytes)
	return false, nil
}
