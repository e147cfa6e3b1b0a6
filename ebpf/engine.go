//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

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

// hooked reports whether every hook is still attached to the cgroup: one
// syscall a hook.
func (k *engine) hooked() bool {
	for i, l := range k.links {
		if l == nil || !(*Proxier)(k).attached(l, hooks[i]) {
			k.log.Info("hook detached by someone else", "hook", hooks[i].name)
			return false
		}
	}
	return true
}

// pinned reports whether, with a PinPath, every map and link is pinned
// there.
func (k *engine) pinned() bool {
	if k.opts.PinPath == "" {
		return true
	}
	for _, name := range mapNamesInOrder {
		if _, err := os.Stat(filepath.Join(k.mapDir, name)); err != nil {
			k.log.Info("pin removed by someone else", "map", name)
			return false
		}
	}
	for _, h := range hooks {
		if _, err := os.Stat((*Proxier)(k).linkPin(h)); err != nil {
			k.log.Info("pin removed by someone else", "hook", h.name)
			return false
		}
	}
	return true
}

// attached reports whether a link still attaches a program to the
// Proxier's cgroup at h's attach point: a link pinned under h's name that
// attaches elsewhere is no hook of the Proxier's, and is never updated.
func (p *Proxier) attached(l link.Link, h hook) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == p.cgID && ebpf.AttachType(cg.AttachType) == h.attach
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

// pinMaps pins the maps whose pins are missing (after a Cleanup, or
// removed by someone else).
func (p *Proxier) pinMaps() error {
	if err := os.MkdirAll(p.mapDir, 0o700); err != nil {
		return fmt.Errorf("pin path: %w", err)
	}
	for name, m := range p.maps.byName() {
		if err := repin(m, filepath.Join(p.mapDir, name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	return nil
}

// pinner is a map or a link.
type pinner interface {
	Pin(string) error
	Unpin() error
}

// repin pins o at path unless a file is there. An object remembers the
// path it was pinned at and takes a Pin to it again for done: Unpin
// first makes it forget a pin someone else removed (the file is gone,
// so Unpin removes nothing).
func repin(o pinner, path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := o.Unpin(); err != nil {
		return err
	}
	if err := o.Pin(path); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// attach attaches every hook that is not attached to the cgroup, gives
// adopted links this process's programs (an atomic replacement: no
// socket goes unbalanced) and pins the links.
func (p *Proxier) attach() error {
	for i, h := range hooks {
		l := p.links[i]
		if l != nil && p.attached(l, h) {
			if p.fresh[i] {
				if err := l.Update(p.progs[i]); err != nil {
					return fmt.Errorf("replace program of %s: %w", h.name, err)
				}
				p.fresh[i] = false
				p.log.Info("adopted hook", "hook", h.name)
			}
			if err := p.pinLink(l, h); err != nil {
				return err
			}
			continue
		}
		nl, err := link.AttachCgroup(link.CgroupOptions{Path: p.opts.Cgroup, Attach: h.attach, Program: p.progs[i]})
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", h.name, p.opts.Cgroup, err)
		}
		if l != nil {
			if p.opts.PinPath != "" {
				_ = l.Unpin()
			}
			l.Close()
		}
		p.links[i], p.fresh[i] = nl, false
		if err := p.pinLink(nl, h); err != nil {
			return err
		}
		p.log.Info("attached hook", "hook", h.name)
	}
	return nil
}

func (p *Proxier) pinLink(l link.Link, h hook) error {
	if p.opts.PinPath == "" {
		return nil
	}
	if err := repin(l, p.linkPin(h)); err != nil {
		return fmt.Errorf("pin link %s: %w", h.name, err)
	}
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
