//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.FlowChecker = (*Proxier)(nil)

// CheckFlow reads back from the BPF maps what the socket hooks do with
// the flow e explains: for a flow that hits a frontend, its entry in
// kp_frontends (the action and set for the node's sockets and for pods'),
// each set it names (slot count, affinity timeout, name) and every slot
// of it (an endpoint holds as many as its weight asks for), and the
// members of a set that lists them; for a flow that hits none, that no
// entry takes it. It compares them with what the explanation's own
// ServicePort plans, and reports every entry missing, changed or in the
// way, and every hook not attached to the cgroup. With a packet path
// (Options.Packets) that gives the kernel's word too, its reading
// follows.
func (p *Proxier) CheckFlow(ctx context.Context, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.eng.Closed():
		return servicelb.KernelCheck{}, ErrClosed
	case p.maps == nil:
		return servicelb.KernelCheck{}, fmt.Errorf("ebpf: check a flow: %w", ErrRenderOnly)
	}
	c := &mapCheck{out: servicelb.KernelCheck{Backend: "ebpf"}}
	sp, why := p.eng.Explained(e)
	switch {
	case why != "":
		c.differ("%s", why)
		return c.out, nil
	case p.model == nil:
		c.differ("no state applied yet: the maps hold nothing of the proxier's")
		return c.out, nil
	}
	for i, h := range hooks {
		if i >= len(p.links) || p.links[i] == nil || !p.attached(p.links[i], h) {
			c.differ("hook %s is not attached to the cgroup %s", h.name, p.opts.Cgroup)
		}
	}
	if sp == nil {
		k := newFEKey(e.Flow.Dst.Addr(), e.Flow.Dst.Port(), e.Flow.Protocol)
		var v feVal
		switch err := p.maps.fe.Lookup(k, &v); {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			c.read("%s: no entry %s", mapFrontends, k)
		case err != nil:
			return c.out, fmt.Errorf("ebpf: check a flow: read %s: %w", mapFrontends, err)
		default:
			c.differ("%s: entry %s (%s) takes a flow no frontend of the state serves", mapFrontends, k, feText(v))
		}
		return c.packets(ctx, p.opts.Packets, e)
	}
	pp := p.model.ports[sp.Key]
	if pp == nil {
		return c.out, fmt.Errorf("ebpf: check a flow: service port %s is applied and not planned", sp.Key)
	}
	for _, f := range pp.frontends {
		var v feVal
		switch err := p.maps.fe.Lookup(f.key, &v); {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			c.differ("%s: entry %s is missing", mapFrontends, f.key)
		case err != nil:
			return c.out, fmt.Errorf("ebpf: check a flow: read %s: %w", mapFrontends, err)
		case v != f.val:
			c.differ("%s: entry %s is %s, want %s", mapFrontends, f.key, feText(v), feText(f.val))
		default:
			c.read("%s: %s: %s", mapFrontends, f.key, feText(v))
		}
	}
	for _, s := range pp.sets {
		if s == nil {
			continue
		}
		if err := c.set(p.maps, s); err != nil {
			return c.out, err
		}
	}
	return c.packets(ctx, p.opts.Packets, e)
}

// mapCheck gathers what CheckFlow reads and finds.
type mapCheck struct {
	out servicelb.KernelCheck
}

func (c *mapCheck) read(format string, args ...any) {
	c.out.Read = append(c.out.Read, fmt.Sprintf(format, args...))
}

func (c *mapCheck) differ(format string, args ...any) {
	c.out.Differences = append(c.out.Differences, fmt.Sprintf(format, args...))
}

func feText(v feVal) string {
	return fmt.Sprintf("node %s set %d, pods %s set %d", v.NodeAct, v.NodeSet, v.PodAct, v.PodSet)
}

// set compares a planned set with the maps: its header, its name, each
// slot, no slot beyond its count, and its members.
func (c *mapCheck) set(m *kmaps, s *setPlan) error {
	lookup := func(mp *ebpf.Map, name string, k, v any) (bool, error) {
		err := mp.Lookup(k, v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("ebpf: check a flow: read %s: %w", name, err)
		}
		return true, nil
	}
	var hdr setVal
	ok, err := lookup(m.sets, mapSets, s.id, &hdr)
	switch {
	case err != nil:
		return err
	case !ok:
		c.differ("%s: set %d (%s) is missing", mapSets, s.id, s.name)
		return nil
	case hdr != s.value():
		c.differ("%s: set %d (%s) has %d slots and timeout %d s, want %d and %d s", mapSets, s.id, s.name,
			hdr.Count, hdr.Timeout, s.value().Count, s.value().Timeout)
	}
	var name nameVal
	if ok, err := lookup(m.names, mapNames, s.id, &name); err != nil {
		return err
	} else if !ok || name != newName(s.name) {
		c.differ("%s: set %d is not named %q", mapNames, s.id, s.name)
	}
	var slots []string
	for i, want := range s.slots {
		var got endpoint
		ok, err := lookup(m.slots, mapSlots, slotKey{s.id, uint32(i)}, &got)
		switch {
		case err != nil:
			return err
		case !ok:
			c.differ("%s: set %d slot %d is missing (want %s)", mapSlots, s.id, i, want)
		case got != want:
			c.differ("%s: set %d slot %d holds %s, want %s", mapSlots, s.id, i, got, want)
		default:
			slots = append(slots, got.String())
		}
		if s.members {
			var one uint32
			if ok, err := lookup(m.members, mapMembers, memberKey{Set: s.id, endpoint: want}, &one); err != nil {
				return err
			} else if !ok {
				c.differ("%s: %s is not listed as a member of set %d", mapMembers, want, s.id)
			}
		}
	}
	var extra endpoint
	if ok, err := lookup(m.slots, mapSlots, slotKey{s.id, uint32(len(s.slots))}, &extra); err != nil {
		return err
	} else if ok {
		c.differ("%s: set %d has a slot %d beyond its %d (%s)", mapSlots, s.id, len(s.slots), len(s.slots), extra)
	}
	c.read("%s: set %d (%s), %d slots, timeout %d s: %s", mapSets, s.id, s.name, hdr.Count, hdr.Timeout, strings.Join(slots, " "))
	return nil
}

// packets adds the packet path's reading, when it gives one.
func (c *mapCheck) packets(ctx context.Context, pk servicelb.Proxier, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	fc, ok := pk.(servicelb.FlowChecker)
	if !ok {
		return c.out, nil
	}
	kc, err := fc.CheckFlow(ctx, e)
	if err != nil {
		return c.out, err
	}
	c.out.Backend += "+" + kc.Backend
	c.out.Read = append(c.out.Read, kc.Read...)
	c.out.Differences = append(c.out.Differences, kc.Differences...)
	return c.out, nil
}
