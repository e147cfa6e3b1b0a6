package nftables

import (
	"context"
	"errors"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// replaceBatch builds the batch that makes the table hold exactly c,
// whatever it holds now, in one transaction and without deleting the
// table: an existing table (left by an earlier process, or changed by
// someone else) is adopted. Its rules are flushed, sets whose definition
// differs are deleted, those that match are emptied (except the affinity
// sets, whose pins survive), chains kproxy does not want are deleted, and
// then everything is written. Established connections keep their conntrack
// entries, so nothing that flows is cut.
func (p *Proxier) replaceBatch(ctx context.Context, c *content) (*nfnl.Batch, error) {
	b := &nfnl.Batch{}
	_, err := p.conn.Table(ctx, nfnl.Inet, p.opts.Table)
	switch {
	case errors.Is(err, nfnl.ErrNotExist):
		b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: p.opts.Table})
		return b, c.create(p.opts.Table, b)
	case err != nil:
		return nil, err
	}
	chains, err := p.conn.Chains(ctx, nfnl.Inet, p.opts.Table)
	if err != nil {
		return nil, err
	}
	sets, err := p.conn.Sets(ctx, nfnl.Inet, p.opts.Table)
	if err != nil {
		return nil, err
	}
	t := p.opts.Table
	b.AddTable(nfnl.Table{Family: nfnl.Inet, Name: t})
	b.FlushTable(nfnl.Inet, t)
	want := map[string]nfnl.Set{}
	for _, d := range c.sets {
		want[d.set.Name] = d.set
	}
	for _, s := range sets {
		w, ok := want[s.Name]
		switch {
		case s.Flags&nfnl.SetAnonymous != 0:
		case !ok || !sameSet(s, w):
			b.DelSet(nfnl.Inet, t, s.Name)
		case !isAffinitySet(s.Name):
			b.FlushSet(nfnl.Inet, t, s.Name)
		}
	}
	hooks := map[string]*nfnl.Hook{}
	for _, ch := range c.chains {
		hooks[ch.name] = ch.hook
	}
	for _, ch := range chains {
		h, ok := hooks[ch.Name]
		if !ok || !sameHook(ch.Hook, h) {
			b.DelChain(nfnl.Inet, t, ch.Name)
		}
	}
	return b, c.create(t, b)
}

func isAffinitySet(name string) bool {
	return name == fixedSet(kindAffinity, servicelb.IPv4).name() || name == fixedSet(kindAffinity, servicelb.IPv6).name()
}

func sameHook(got, want *nfnl.Hook) bool {
	if got == nil || want == nil {
		return got == nil && want == nil
	}
	gp, wp := nfnl.VerdictAccept, nfnl.VerdictAccept
	if got.Policy != nil {
		gp = *got.Policy
	}
	if want.Policy != nil {
		wp = *want.Policy
	}
	return got.Num == want.Num && got.Priority == want.Priority && got.Type == want.Type && gp == wp && got.Device == want.Device
}

// verify compares the table in the kernel with c. It returns "" when they
// match, else a description of the first difference found.
func (p *Proxier) verify(ctx context.Context, c *content) (string, error) {
	t := p.opts.Table
	if _, err := p.conn.Table(ctx, nfnl.Inet, t); errors.Is(err, nfnl.ErrNotExist) {
		return "table is missing", nil
	} else if err != nil {
		return "", err
	}
	if why, err := p.verifyChains(ctx, c); why != "" || err != nil {
		return why, err
	}
	return p.verifySets(ctx, c)
}

func (p *Proxier) verifyChains(ctx context.Context, c *content) (string, error) {
	t := p.opts.Table
	chains, err := p.conn.Chains(ctx, nfnl.Inet, t)
	if err != nil {
		return "", err
	}
	if len(chains) != len(c.chains) {
		return fmt.Sprintf("%d chains, want %d", len(chains), len(c.chains)), nil
	}
	hooks := map[string]*nfnl.Hook{}
	for _, ch := range chains {
		hooks[ch.Name] = ch.Hook
	}
	for _, ch := range c.chains {
		h, ok := hooks[ch.name]
		if !ok || !sameHook(h, ch.hook) {
			return fmt.Sprintf("chain %s is missing or hooked differently", ch.name), nil
		}
	}
	rules, err := p.conn.Rules(ctx, nfnl.Inet, t, "")
	if err != nil {
		return "", err
	}
	byChain := map[string][]nfnl.Rule{}
	for _, r := range rules {
		byChain[r.Chain] = append(byChain[r.Chain], r)
	}
	for _, ch := range c.chains {
		got := byChain[ch.name]
		if len(got) != len(ch.rules) {
			return fmt.Sprintf("chain %s has %d rules, want %d", ch.name, len(got), len(ch.rules)), nil
		}
		for i, r := range ch.rules {
			if !nfnl.SameExprs(nfnl.Inet, got[i].Raw, r.exprs) {
				return fmt.Sprintf("chain %s rule %d differs from %q", ch.name, i, r.text), nil
			}
		}
	}
	return "", nil
}

func (p *Proxier) verifySets(ctx context.Context, c *content) (string, error) {
	t := p.opts.Table
	sets, err := p.conn.Sets(ctx, nfnl.Inet, t)
	if err != nil {
		return "", err
	}
	got := map[string]nfnl.Set{}
	for _, s := range sets {
		if s.Flags&nfnl.SetAnonymous == 0 {
			got[s.Name] = s
		}
	}
	if len(got) != len(c.sets) {
		return fmt.Sprintf("%d sets, want %d", len(got), len(c.sets)), nil
	}
	for _, d := range c.sets {
		s, ok := got[d.set.Name]
		if !ok {
			return fmt.Sprintf("set %s is missing", d.set.Name), nil
		}
		if !sameSet(s, d.set) {
			return fmt.Sprintf("set %s is defined differently: %+v, want %+v", d.set.Name, s, d.set), nil
		}
		if d.id.kind() == kindAffinity {
			continue
		}
		els, err := p.conn.Elements(ctx, nfnl.Inet, t, d.set.Name)
		if err != nil {
			return "", err
		}
		if why := sameElems(els, c.elems[d.id]); why != "" {
			return fmt.Sprintf("set %s: %s", d.set.Name, why), nil
		}
	}
	return "", nil
}

func sameElems(got []nfnl.Element, want []elem) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d elements, want %d", len(got), len(want))
	}
	byID := make(map[string]*elem, len(want))
	for i := range want {
		byID[want[i].id()] = &want[i]
	}
	for _, g := range got {
		e := elemOf(g)
		w, ok := byID[e.id()]
		if !ok || !w.same(&e) {
			return fmt.Sprintf("unexpected element %x", g.Key)
		}
	}
	return ""
}
