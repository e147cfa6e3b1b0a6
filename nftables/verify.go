//go:build linux

package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

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
	tbl, err := p.conn.Table(ctx, nfnl.Inet, t)
	switch {
	case errors.Is(err, nfnl.ErrNotExist):
		return "table is missing", nil
	case err != nil:
		return "", err
	case tbl.Flags != 0:
		// A dormant table (or one someone else owns) forwards nothing.
		return fmt.Sprintf("table flags %#x, want none", tbl.Flags), nil
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
	want := make(map[string]*chainPlan, len(c.chains))
	for i := range c.chains {
		want[c.chains[i].name] = &c.chains[i]
	}
	for _, ch := range chains {
		w, ok := want[ch.Name]
		if !ok || !sameHook(ch.Hook, w.hook) {
			return fmt.Sprintf("chain %s is not kproxy's or hooked differently", ch.Name), nil
		}
	}
	return p.verifyRules(ctx, want)
}

// verifyRules reads the table's rules in one dump and compares each with
// the plan. A rule that read back as planned once keeps its kernel
// encoding, so that later checks compare bytes.
func (p *Proxier) verifyRules(ctx context.Context, want map[string]*chainPlan) (string, error) {
	seen := make(map[string]int, len(want))
	var why string
	err := p.conn.EachRule(ctx, nfnl.Inet, p.opts.Table, "", func(r *nfnl.Rule) error {
		ch := want[r.Chain]
		i := seen[r.Chain]
		seen[r.Chain] = i + 1
		if ch == nil || i >= len(ch.rules) {
			why = fmt.Sprintf("chain %s has more rules than planned", r.Chain)
			return errStop
		}
		if !ch.rules[i].matches(r.Raw) {
			why = fmt.Sprintf("chain %s rule %d differs from %q", r.Chain, i, ch.rules[i].text)
			return errStop
		}
		return nil
	})
	if why != "" {
		return why, nil
	}
	if err != nil {
		return "", err
	}
	for name, ch := range want {
		if seen[name] != len(ch.rules) {
			return fmt.Sprintf("chain %s has %d rules, want %d", name, seen[name], len(ch.rules)), nil
		}
	}
	return "", nil
}

// errStop ends a dump early.
var errStop = errors.New("stop")

// matches reports whether a dumped rule is this rule.
func (r *rule) matches(raw []nfnl.RawExpr) bool {
	if r.kernel != nil {
		return slices.EqualFunc(raw, r.kernel, func(a, b nfnl.RawExpr) bool {
			return a.Name == b.Name && bytes.Equal(a.Data, b.Data)
		})
	}
	if !nfnl.SameExprs(nfnl.Inet, raw, r.exprs) {
		return false
	}
	if r.own {
		return true // a port's own rule keeps no bytes (see rule.raw)
	}
	k := make([]nfnl.RawExpr, len(raw))
	for i, x := range raw {
		k[i] = nfnl.RawExpr{Name: x.Name, Data: bytes.Clone(x.Data)}
	}
	r.kernel = k
	return true
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
		n, sum, err := p.elemDigest(ctx, d.set.Name)
		if err != nil {
			return "", err
		}
		wn, wsum := digest(p.seed, c.elems[d.id])
		if n != wn || sum != wsum {
			return fmt.Sprintf("set %s: %d elements, want %d, or other elements", d.set.Name, n, wn), nil
		}
	}
	return "", nil
}

// elemDigest reads a set's elements and returns their number and the sum
// of their hashes: a digest that does not depend on the dump's order.
func (p *Proxier) elemDigest(ctx context.Context, set string) (int, uint64, error) {
	var n int
	var sum uint64
	err := p.conn.EachElement(ctx, nfnl.Inet, p.opts.Table, set, func(el *nfnl.Element) error {
		e := elemOf(*el)
		n++
		sum += e.hash(p.seed)
		return nil
	})
	return n, sum, err
}

func digest(seed maphash.Seed, parts []elemPart) (int, uint64) {
	var n int
	var sum uint64
	for _, p := range parts {
		for i := range p.es {
			sum += p.es[i].hash(seed)
		}
		n += len(p.es)
	}
	return n, sum
}
