//go:build linux

package iptables

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/xtables"
)

// tableModel is the content of a Proxier's tables as the incremental
// path leaves them: what an Applier holds after committing each Tx.
type tableModel map[xtables.Table]*xtables.TableContent

func (m tableModel) table(t xtables.Table) *xtables.TableContent {
	tc := m[t]
	if tc == nil {
		tc = &xtables.TableContent{Chains: map[string][]xtables.Rule{}, Keyed: map[string]map[string][]xtables.Rule{}}
		m[t] = tc
	}
	return tc
}

// txRecorder is a tableWriter that records the changes, to apply them to
// a model once planning succeeded.
type txRecorder []func(tableModel)

func (r *txRecorder) SetOwner(any) {}

func (r *txRecorder) SetChain(t xtables.Table, name string, rules []xtables.Rule) {
	*r = append(*r, func(m tableModel) { m.table(t).Chains[name] = rules })
}

func (r *txRecorder) DeleteChain(t xtables.Table, name string) {
	*r = append(*r, func(m tableModel) { delete(m.table(t).Chains, name) })
}

func (r *txRecorder) SetKeyed(t xtables.Table, chain, key string, rules []xtables.Rule) {
	*r = append(*r, func(m tableModel) {
		tc := m.table(t)
		keys := tc.Keyed[chain]
		if keys == nil {
			keys = map[string][]xtables.Rule{}
			tc.Keyed[chain] = keys
		}
		if len(rules) == 0 {
			delete(keys, key)
		} else {
			keys[key] = rules
		}
	})
}

func (r *txRecorder) apply(m tableModel) {
	for _, f := range *r {
		f(m)
	}
}

// clone returns a copy of the model that changes do not share. Rules are
// never modified in place, so the rule slices are shared.
func (m tableModel) clone() tableModel {
	out := tableModel{}
	for t, tc := range m {
		c := out.table(t)
		maps.Copy(c.Chains, tc.Whole())
		for chain, keys := range tc.Keyed {
			c.Keyed[chain] = maps.Clone(keys)
		}
		c.Jumps = tc.Jumps
	}
	return out
}

// lines returns the model as iptables-save lines by place: "table chain
// name", "table keyed chain key" and "table jumps chain", for diffs.
func (m tableModel) lines() map[string][]string {
	out := map[string][]string{}
	text := func(t xtables.Table, chain string, rules []xtables.Rule) []string {
		ls := make([]string, 0, len(rules))
		for i := range rules {
			ls = append(ls, string(rules[i].AppendSave(nil, t.Family, chain)))
		}
		return ls
	}
	for t, tc := range m {
		for name, rules := range tc.Whole() {
			out[fmt.Sprintf("%s chain %s", t, name)] = text(t, name, rules)
		}
		for chain, keys := range tc.Keyed {
			for key, rules := range keys {
				out[fmt.Sprintf("%s keyed %s %q", t, chain, key)] = text(t, chain, rules)
			}
		}
		for chain, rules := range tc.Jumps {
			out[fmt.Sprintf("%s jumps %s", t, chain)] = text(t, chain, rules)
		}
	}
	return out
}

// chains returns the names of the model's chains of every table.
func (m tableModel) chains() []string {
	var out []string
	for _, tc := range m {
		out = slices.AppendSeq(out, maps.Keys(tc.Whole()))
		out = slices.AppendSeq(out, maps.Keys(tc.Keyed))
	}
	return out
}
