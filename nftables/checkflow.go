//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.FlowChecker = (*Proxier)(nil)

// CheckFlow reads back from the kernel what serves the flow e explains:
// the table, the chains no port owns (the dispatch chain every flow
// passes, the chains of the verdict shapes in use, the balancing chains)
// and the node's elements (the pod and service CIDRs), and, for a flow
// that hits a frontend, its service port's chains with their rules (a
// port with affinity), its frontends' elements in the services map or
// the sets of their shape and buckets, in the firewall sets, its
// endpoints' elements in the endpoints map, and the cluster IP and
// hairpin elements it needs, and that no other shape or bucket set holds
// its frontends; for a flow that hits none, that no element of the
// services map or of a shape set takes its address, protocol and port.
// It compares each with the plan of the explained port, which the
// explanation's own ServicePort renders, and reports every rule, element
// or chain missing, changed or in the way.
func (p *Proxier) CheckFlow(ctx context.Context, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.eng.Closed():
		return servicelb.KernelCheck{}, ErrClosed
	case p.conn == nil:
		return servicelb.KernelCheck{}, fmt.Errorf("nftables: check a flow: %w", ErrRenderOnly)
	}
	c := &flowCheck{p: p, ctx: ctx, out: servicelb.KernelCheck{Backend: "nftables"}, sets: map[setID]*setWant{}}
	sp, why := p.eng.Explained(e)
	m := p.model
	switch {
	case why != "":
		c.differ("%s", why)
		return c.out, nil
	case m == nil:
		c.differ("no state applied yet: the kernel holds nothing of the proxier's")
		return c.out, nil
	}
	if err := c.table(); err != nil || !c.out.Agrees() {
		return c.out, err
	}
	chains := p.plan.nodeChains(m)
	for set, es := range m.node.elems {
		c.want(set).present = append(c.want(set).present, es...)
	}
	if sp != nil {
		pp := m.ports[sp.Key]
		if pp == nil {
			return c.out, fmt.Errorf("nftables: check a flow: service port %s is applied and not planned", sp.Key)
		}
		fr := p.plan.fragment(pp, m.cfg)
		chains = append(chains, fr.chains...)
		for _, x := range fr.elems {
			c.want(x.set).present = append(c.want(x.set).present, x.es...)
		}
		for _, r := range refsOf(pp.sp) {
			c.want(r.set).present = append(c.want(r.set).present, r.elem())
		}
		var keys [][]byte
		for fe := range pp.sp.AllFrontends() {
			keys = append(keys, entryBytes(fe.Addr, pp.sp.Port.Protocol, fe.Port))
		}
		for set := range m.shared {
			if set.family() == pp.sp.Family && !slices.Contains(pp.shared, set) {
				c.want(set).absent = append(c.want(set).absent, keys...)
			}
		}
	} else if e.Flow.Dst.IsValid() {
		f := servicelb.FamilyOf(e.Flow.Dst.Addr())
		key := entryBytes(e.Flow.Dst.Addr(), e.Flow.Protocol, e.Flow.Dst.Port())
		c.want(fixedSet(kindServices, f)).absent = append(c.want(fixedSet(kindServices, f)).absent, key)
		for set := range m.shared {
			if set.family() == f && set.kind() == kindShape {
				c.want(set).absent = append(c.want(set).absent, key)
			}
		}
	}
	present, err := p.conn.Chains(ctx, nfnl.Inet, p.opts.Table)
	if err != nil {
		return c.out, fmt.Errorf("nftables: check a flow: %w", err)
	}
	c.chains = map[string]bool{}
	for _, ch := range present {
		c.chains[ch.Name] = true
	}
	for i := range chains {
		if err := c.chain(&chains[i]); err != nil {
			return c.out, err
		}
	}
	for _, set := range slices.Sorted(maps.Keys(c.sets)) {
		if err := c.elements(set, c.sets[set]); err != nil {
			return c.out, err
		}
	}
	return c.out, nil
}

// flowCheck gathers what CheckFlow reads and finds.
type flowCheck struct {
	p   *Proxier
	ctx context.Context
	out servicelb.KernelCheck
	// sets are what the flow needs of each set; chains the table's
	// chains, by name.
	sets   map[setID]*setWant
	chains map[string]bool
}

// setWant is what a flow needs of one set: elements present as planned,
// and keys no element may hold.
type setWant struct {
	present []elem
	absent  [][]byte
}

func (c *flowCheck) want(set setID) *setWant {
	w := c.sets[set]
	if w == nil {
		w = &setWant{}
		c.sets[set] = w
	}
	return w
}

func (c *flowCheck) read(format string, args ...any) {
	c.out.Read = append(c.out.Read, fmt.Sprintf(format, args...))
}

func (c *flowCheck) differ(format string, args ...any) {
	c.out.Differences = append(c.out.Differences, fmt.Sprintf(format, args...))
}

// table checks that the table exists, active.
func (c *flowCheck) table() error {
	name := c.p.opts.Table
	t, err := c.p.conn.Table(c.ctx, nfnl.Inet, name)
	switch {
	case errors.Is(err, nfnl.ErrNotExist):
		c.differ("table inet %s is missing", name)
		return nil
	case err != nil:
		return fmt.Errorf("nftables: check a flow: %w", err)
	case t.Flags != 0:
		c.differ("table inet %s has flags %#x (dormant, or someone else's): it forwards nothing", name, t.Flags)
	}
	c.read("table inet %s", name)
	return nil
}

// chain reads a chain's rules and compares them with the plan.
func (c *flowCheck) chain(ch *chainPlan) error {
	if !c.chains[ch.name] {
		c.differ("chain %s is missing", ch.name)
		return nil
	}
	rs, err := c.p.conn.RulesRaw(c.ctx, nfnl.Inet, c.p.opts.Table, ch.name)
	if err != nil {
		return fmt.Errorf("nftables: check a flow: %w", err)
	}
	c.read("chain %s: %s", ch.name, rulesText(len(rs)))
	for i, r := range rs {
		if i >= len(ch.rules) {
			c.differ("chain %s: rule %d is not the proxier's (the chain has %d rules, the plan %d)", ch.name, i, len(rs), len(ch.rules))
			break
		}
		if !ch.rules[i].matches(r.Raw) {
			c.differ("chain %s: rule %d differs from %q", ch.name, i, ch.rules[i].text)
		}
	}
	if len(rs) < len(ch.rules) {
		c.differ("chain %s: %d rules, the plan has %d: %q is missing", ch.name, len(rs), len(ch.rules), ch.rules[len(rs)].text)
	}
	return nil
}

// elements reads a set's elements and looks for those the flow needs and
// those it must not meet.
func (c *flowCheck) elements(set setID, w *setWant) error {
	present := make(map[string]*elem, len(w.present))
	for i := range w.present {
		present[w.present[i].id()] = &w.present[i]
	}
	found := map[string]bool{}
	var foreign []elem
	err := c.p.conn.EachElement(c.ctx, nfnl.Inet, c.p.opts.Table, set.name(), func(el *nfnl.Element) error {
		got := elemOf(*el)
		id := got.id()
		if want := present[id]; want != nil {
			found[id] = true
			if !want.same(&got) {
				foreign = append(foreign, cloneElem(got))
			}
			return nil
		}
		for _, k := range w.absent {
			if string(got.key) == string(k) {
				foreign = append(foreign, cloneElem(got))
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, nfnl.ErrNotExist) || errors.Is(err, syscall.ENOENT):
		c.differ("set %s is missing", set.name())
		return nil
	case err != nil:
		return fmt.Errorf("nftables: check a flow: %w", err)
	}
	var held, missing []elem
	for i := range w.present {
		if found[w.present[i].id()] {
			held = append(held, w.present[i])
		} else {
			missing = append(missing, w.present[i])
		}
	}
	kind := "set"
	if set.kind() == kindServices || set.kind() == kindEndpoints {
		kind = "map"
	}
	texts := elemTexts(set, held)
	for _, t := range texts {
		c.read("%s %s: %s", kind, set.name(), t)
	}
	if len(missing) > 0 {
		texts := elemTexts(set, missing)
		for _, t := range texts {
			c.differ("%s %s: element %s is missing", kind, set.name(), t)
		}
		if len(texts) == 0 {
			c.differ("%s %s: %d elements are missing", kind, set.name(), len(missing))
		}
	}
	for _, f := range foreign {
		texts := elemTexts(set, []elem{f})
		text := fmt.Sprintf("% x", f.key)
		if len(texts) > 0 {
			text = texts[0]
		}
		c.differ("%s %s: element %s is not the proxier's plan for this flow", kind, set.name(), text)
	}
	return nil
}

// cloneElem copies an element a dump lent.
func cloneElem(e elem) elem {
	e.key, e.keyEnd, e.data = slices.Clone(e.key), slices.Clone(e.keyEnd), slices.Clone(e.data)
	return e
}

// rulesText is "1 rule" or "<n> rules".
func rulesText(n int) string {
	if n == 1 {
		return "1 rule"
	}
	return fmt.Sprintf("%d rules", n)
}
