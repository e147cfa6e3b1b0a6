//go:build linux

package ebpf

import (
	"context"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// engine is the Proxier's side of internal/syncer's Engine: what its
// maps hold and how to change them. The Engine calls it with p.mu held.
type engine Proxier

// Check reports what can be known of the kernel without a syscall: a
// change of endpoints is map writes, which are right whatever else
// someone did to the hooks or pins, so a sync that changes something
// looks at nothing else and costs its writes alone. Verify, run by every
// sync of an unchanged state (a caller's periodic sync) and at most every
// VerifyInterval by the others, checks the hooks, the pins and the maps.
func (k *engine) Check(context.Context) (bool, error) {
	return true, nil
}

// Verify checks the hooks and the pins, then reads the maps back and
// compares every entry with the model.
func (k *engine) Verify(context.Context) (bool, error) {
	if !k.hooked() || !k.pinned() {
		return false, nil
	}
	got, err := k.maps.read()
	if err != nil {
		return false, err
	}
	d := diffContent(got, k.model.content(k.cookie))
	if n := d.len(); n > 0 {
		k.log.Info("maps differ from what was written", "entries", n)
		return false, nil
	}
	return true, nil
}

// Write makes the maps hold st, adopting the sets it finds in them (by
// name, with their slots, so that nothing moves that need not), then
// attaches the hooks, or gives adopted links this process's programs.
func (k *engine) Write(_ context.Context, st *servicelb.State) error {
	p := (*Proxier)(k)
	found, err := k.maps.read()
	if err != nil {
		return err
	}
	m, err := buildModel(st, &k.caps, found, k.opts.Packets != nil)
	if err != nil {
		return err
	}
	d := diffContent(found, m.content(k.cookie))
	if err := k.maps.write(d); err != nil {
		return err
	}
	k.model = m
	if k.opts.PinPath != "" {
		if err := p.pinMaps(); err != nil {
			return err
		}
	}
	if err := p.attach(); err != nil {
		return err
	}
	if k.opts.PinPath != "" && !k.retired {
		if err := p.retireLayouts(); err != nil {
			return err
		}
		k.retired = true
	}
	k.log.Debug("maps written", "entries", d.len(), "ports", len(m.ports))
	return nil
}

// Apply writes what the changed service ports need, and nothing else.
func (k *engine) Apply(_ context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	s, err := k.model.plan(st, ch, &k.caps)
	if err != nil {
		return false, err
	}
	if err := k.maps.write(s.d); err != nil {
		// The next sync writes the whole state over a new model.
		k.model.abandon()
		return false, err
	}
	k.model.commit(s)
	k.log.Debug("applied changes", "added", len(ch.Added), "removed", len(ch.Removed), "changed", len(ch.Changed),
		"writes", s.d.len())
	return false, nil
}
