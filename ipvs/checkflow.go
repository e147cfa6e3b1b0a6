//go:build linux

package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.FlowChecker = (*Proxier)(nil)

// CheckFlow reads back from the kernel what serves the flow e explains:
// for a flow that hits a frontend, its service port's virtual servers
// (the frontend's own and the firewall-mark ones that steer an origin
// elsewhere) with their settings and real servers at their weights, the
// frontend's address on the dummy link, the port's entries in the helper
// sets, and the helper rules of its family (masquerade, filtering and the
// steering of origins, every port's); for a flow that hits none, that no
// virtual server takes it. It compares them with what the explanation's own
// ServicePort plans, and reports every virtual server, real server, set
// entry, address or rule missing, changed or in the way. A real server of
// weight 0 the plan does not hold is a draining one: read, no difference.
func (p *Proxier) CheckFlow(ctx context.Context, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.errIf(); err != nil {
		return servicelb.KernelCheck{}, err
	}
	c := &vsCheck{p: p, ctx: ctx, out: servicelb.KernelCheck{Backend: "ipvs"}}
	sp, why := p.eng.Explained(e)
	switch {
	case why != "":
		c.differ("%s", why)
		return c.out, nil
	case p.model == nil:
		c.differ("no state applied yet: the kernel holds nothing of the proxier's")
		return c.out, nil
	case sp == nil:
		dst := e.Flow.Dst
		vs := &VirtualServer{Addr: dst.Addr(), Protocol: e.Flow.Protocol, Port: dst.Port()}
		ok, err := p.k.exists(ctx, vs)
		if err != nil {
			return c.out, fmt.Errorf("ipvs: check a flow: %w", err)
		}
		if ok {
			c.differ("virtual server %s exists: it takes a flow no frontend of the state serves", vs.key())
		} else {
			c.read("no virtual server %s", vs.key())
		}
		return c.out, nil
	}
	pp := p.model.ports[sp.Key]
	if pp == nil {
		return c.out, fmt.Errorf("ipvs: check a flow: service port %s is applied and not planned", sp.Key)
	}
	for _, vs := range pp.allServers() {
		if err := c.server(vs); err != nil {
			return c.out, err
		}
	}
	if err := c.addresses(pp); err != nil {
		return c.out, err
	}
	for _, en := range pp.entries {
		ok, err := p.sets.c.Test(ctx, setID(en.set, en.family), toEntry(en))
		if err != nil {
			return c.out, fmt.Errorf("ipvs: check a flow: helper set %s: %w", setID(en.set, en.family), err)
		}
		if ok {
			c.read("set %s: %s", setID(en.set, en.family), en)
		} else {
			c.differ("set %s: entry %s is missing", setID(en.set, en.family), en)
		}
	}
	// The helper rules of the family are compared whole, every port's
	// steering rules in their chains (a foreign rule anywhere is in the
	// way); of those, the port's own are read.
	node := p.eng.Applied().Node()
	n := ruleNames{o: &p.opts, f: sp.Family, index: func(id string) uint16 { return p.sets.index[id] }}
	key := pp.key().String()
	read, differ, err := p.rules.CompareKeys(ctx, planRules(n, &node, p.model.steerRules(sp.Family)), func(k string) bool { return k == key })
	if err != nil {
		return c.out, fmt.Errorf("ipvs: check a flow: helper rules: %w", err)
	}
	c.out.Read, c.out.Differences = append(c.out.Read, read...), append(c.out.Differences, differ...)
	return c.out, nil
}

// vsCheck gathers what CheckFlow reads and finds.
type vsCheck struct {
	p   *Proxier
	ctx context.Context
	out servicelb.KernelCheck
}

func (c *vsCheck) read(format string, args ...any) {
	c.out.Read = append(c.out.Read, fmt.Sprintf(format, args...))
}

func (c *vsCheck) differ(format string, args ...any) {
	c.out.Differences = append(c.out.Differences, fmt.Sprintf(format, args...))
}

// server compares a planned virtual server with the kernel's.
func (c *vsCheck) server(want *VirtualServer) error {
	got, ok, err := c.p.k.ipvs.Service(c.ctx, toService(want))
	if err != nil {
		return fmt.Errorf("ipvs: check a flow: %w", opErr("look up virtual server", want.key().String(), err))
	}
	if !ok {
		c.differ("virtual server %s is missing", want.key())
		return nil
	}
	vs, known := fromService(&got)
	switch {
	case !known:
		c.differ("virtual server %s is of a kind the proxier does not make", want.key())
		return nil
	case !sameService(vs, want):
		c.differ("virtual server %s: scheduler %s, persistence %d s, want %s, %d s", want.key(),
			vs.Scheduler, vs.Persistence, want.Scheduler, want.Persistence)
	}
	reals, err := c.p.k.reals(c.ctx, want)
	if err != nil {
		return fmt.Errorf("ipvs: check a flow: %w", err)
	}
	c.read("virtual server %s %s, persistence %d s: %d real servers", want.key(), vs.Scheduler, vs.Persistence, len(reals))
	for _, r := range want.Real {
		i := slices.IndexFunc(reals, func(g realInfo) bool { return g.AddrPort() == r.AddrPort() })
		switch {
		case i < 0:
			c.differ("virtual server %s: real server %s is missing", want.key(), r.AddrPort())
		case reals[i].Weight != r.Weight:
			c.differ("virtual server %s: real server %s has weight %d, want %d", want.key(), r.AddrPort(), reals[i].Weight, r.Weight)
		default:
			c.read("  -> %s weight %d", r.AddrPort(), r.Weight)
		}
	}
	for _, g := range reals {
		if want.realIndex(g.AddrPort()) >= 0 {
			continue
		}
		if g.Weight == 0 {
			c.read("  -> %s weight 0 (draining: %d active connections)", g.AddrPort(), g.active)
			continue
		}
		c.differ("virtual server %s: real server %s (weight %d) is not the plan's", want.key(), g.AddrPort(), g.Weight)
	}
	return nil
}

// addresses checks that the dummy link holds the addresses of the port's
// address virtual servers, but the node's own.
func (c *vsCheck) addresses(pp *portPlan) error {
	var want []*VirtualServer
	for _, vs := range pp.servers {
		if vs.FWMark == 0 && !c.p.nodeIP[vs.Addr] && !vs.Addr.IsLoopback() {
			want = append(want, vs)
		}
	}
	if len(want) == 0 {
		return nil
	}
	l, ok, err := c.p.k.dummy(c.ctx)
	if err != nil {
		return fmt.Errorf("ipvs: check a flow: %w", err)
	}
	if !ok {
		c.differ("the dummy link %s is missing", c.p.k.link)
		return nil
	}
	prefixes, err := c.p.k.addresses(c.ctx, l)
	if err != nil {
		return fmt.Errorf("ipvs: check a flow: %w", err)
	}
	for _, vs := range want {
		if slices.ContainsFunc(prefixes, func(pf netip.Prefix) bool { return pf.IsSingleIP() && pf.Addr() == vs.Addr }) {
			c.read("link %s: %s", l.Name, vs.Addr)
		} else {
			c.differ("link %s: address %s is missing", l.Name, vs.Addr)
		}
	}
	return nil
}
