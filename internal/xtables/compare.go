//go:build linux

package xtables

import (
	"context"
	"fmt"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// Compare reads back the chains and rules want names and says where the
// kernel does not hold them as want has them, changing nothing. want may
// hold a part of the whole chains the Applier holds (the node's and one
// service port's), and nothing else the tables hold is compared: a whole
// chain must hold exactly its rules; a keyed chain each key's rules in one
// run, and no rule that is none of its keys' (want must hold every key of
// a keyed chain it names: a rule of any other is taken for a foreign one);
// a builtin chain the jumps in one run. read names what was read, one
// object a line; differ names each difference.
func (a *Applier) Compare(ctx context.Context, want map[Table]*TableContent) (read, differ []string, err error) {
	return a.CompareKeys(ctx, want, nil)
}

// CompareKeys is Compare, reading of the keyed chains only the runs of
// the keys wanted reports true for (nil: every key); the rules of the
// other keys still count as the owner's.
func (a *Applier) CompareKeys(ctx context.Context, want map[Table]*TableContent, wanted func(key string) bool) (read, differ []string, err error) {
	for _, t := range sortedTables(want) {
		tc := want[t]
		exists, _, err := a.tableUse(ctx, t)
		if err != nil {
			return read, differ, err
		}
		if !exists {
			differ = append(differ, fmt.Sprintf("table %s is missing", t))
			continue
		}
		chains, err := a.conn.Chains(ctx, nfnl.Family(t.Family), string(t.Name))
		if err != nil {
			return read, differ, fmt.Errorf("list chains of %s: %w", t, err)
		}
		present := map[string]bool{}
		for _, c := range chains {
			present[c.Name] = true
		}
		cm := comparer{a: a, ctx: ctx, t: t, present: present}
		for _, name := range sortedKeys(tc.Chains) {
			cm.whole(name, tc.Chains[name])
		}
		if tc.Parts != nil {
			for _, group := range tc.Parts {
				for _, c := range group {
					cm.whole(c.Name, c.Rules)
				}
			}
		}
		for _, chain := range sortedKeys(tc.Keyed) {
			cm.keyed(chain, tc.Keyed[chain], tc.KeyOwners, wanted)
		}
		for _, chain := range sortedKeys(tc.Jumps) {
			cm.run(chain, tc.Jumps[chain], "the jumps to the owner's chains")
		}
		read, differ = append(read, cm.read...), append(differ, cm.differ...)
		if cm.err != nil {
			return read, differ, cm.err
		}
	}
	return read, differ, nil
}

// comparer compares chains of one table, reading each once.
type comparer struct {
	a       *Applier
	ctx     context.Context
	t       Table
	present map[string]bool
	dumped  map[string][]dumpedRule
	read    []string
	differ  []string
	err     error
}

// rules returns a chain's rules as the kernel holds them, and whether the
// chain exists.
func (c *comparer) rules(chain string) ([]dumpedRule, bool) {
	if c.err != nil || !c.present[chain] {
		return nil, false
	}
	if rs, ok := c.dumped[chain]; ok {
		return rs, true
	}
	rs, err := c.a.dumpRules(c.ctx, c.t, chain)
	if err != nil {
		c.err = err
		return nil, false
	}
	if c.dumped == nil {
		c.dumped = map[string][]dumpedRule{}
	}
	c.dumped[chain] = rs
	return rs, true
}

func (c *comparer) note(to *[]string, format string, args ...any) {
	*to = append(*to, fmt.Sprintf("%s chain %s", c.t, fmt.Sprintf(format, args...)))
}

// whole compares a whole chain.
func (c *comparer) whole(name string, want []Rule) {
	got, ok := c.rules(name)
	if !ok {
		if c.err == nil {
			c.note(&c.differ, "%s is missing", name)
		}
		return
	}
	c.note(&c.read, "%s: %d rule%s", name, len(got), map[bool]string{true: "s"}[len(got) != 1])
	sigs := sigsOf(c.t.Family, want)
	for i := range max(len(got), len(sigs)) {
		switch {
		case i >= len(sigs):
			c.note(&c.differ, "%s: rule %d is not the owner's (%d rules, %d planned)", name, i+1, len(got), len(sigs))
		case i >= len(got):
			c.note(&c.differ, "%s: rule %d is missing: %s", name, i+1, ruleText(&want[i]))
		case got[i].sig != sigs[i] || sigs[i] == 0:
			c.note(&c.differ, "%s: rule %d differs from %s", name, i+1, ruleText(&want[i]))
		default:
			continue
		}
		return
	}
}

// keyed looks for each key's rules in a keyed chain, and for rules of no
// key.
func (c *comparer) keyed(chain string, keys map[string][]Rule, owners map[string]any, wanted func(key string) bool) {
	planned := map[uint64]bool{}
	for _, key := range sortedKeys(keys) {
		for _, sig := range sigsOf(c.t.Family, keys[key]) {
			planned[sig] = true
		}
		if wanted != nil && !wanted(key) {
			continue
		}
		what := fmt.Sprintf("the rules of %v", owners[key])
		if owners[key] == nil {
			what = "the owner's own rules"
		}
		c.run(chain, keys[key], what)
	}
	got, ok := c.rules(chain)
	if !ok {
		return
	}
	var foreign []int
	for i, r := range got {
		if !planned[r.sig] || r.sig == 0 {
			foreign = append(foreign, i+1)
		}
	}
	for _, i := range foreign[:min(len(foreign), maxForeignNamed)] {
		c.note(&c.differ, "%s: rule %d is not the owner's: a foreign rule, or one of a key changed", chain, i)
	}
	if n := len(foreign) - maxForeignNamed; n > 0 {
		c.note(&c.differ, "%s: %d more rules are not the owner's", chain, n)
	}
}

// maxForeignNamed bounds the foreign rules of a keyed chain named one by
// one; the others are counted.
const maxForeignNamed = 3

// run looks for rules in one run of a chain.
func (c *comparer) run(chain string, want []Rule, what string) {
	if len(want) == 0 {
		return
	}
	got, ok := c.rules(chain)
	if !ok {
		if c.err == nil {
			c.note(&c.differ, "%s is missing", chain)
		}
		return
	}
	sigs := sigsOf(c.t.Family, want)
	for i := 0; i+len(sigs) <= len(got); i++ {
		if sameSigs(dumpedSigs(got[i:i+len(sigs)]), sigs) {
			c.note(&c.read, "%s: %s (%d rule%s)", chain, what, len(sigs), map[bool]string{true: "s"}[len(sigs) != 1])
			return
		}
	}
	c.note(&c.differ, "%s: %s are missing or changed (want %s)", chain, what, ruleText(&want[0]))
}

// ruleText is a rule as iptables-save writes it, without its chain.
func ruleText(r *Rule) string { return strings.TrimPrefix(r.String(), "-A X ") }

// RuleTexts names the rules of a chain the kernel holds by handle: each
// that is one of planned (by its signature) has that rule's text, as
// iptables-save writes it without the chain.
func (a *Applier) RuleTexts(ctx context.Context, t Table, chain string, planned []Rule) (map[uint64]string, error) {
	bySig := make(map[uint64]string, len(planned))
	for i := range planned {
		if sig, err := Signature(t.Family, &planned[i]); err == nil && sig != 0 {
			bySig[sig] = ruleText(&planned[i])
		}
	}
	got, err := a.dumpRules(ctx, t, chain)
	if err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	for _, d := range got {
		if s, ok := bySig[d.sig]; ok {
			out[d.handle] = s
		}
	}
	return out, nil
}
