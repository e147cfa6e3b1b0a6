package iptables

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// familyTables returns the nat and filter tables of a family.
func familyTables(f servicelb.Family) (nat, filter xtables.Table) {
	return xtables.Table{Family: xfam(f), Name: xtables.NAT}, xtables.Table{Family: xfam(f), Name: xtables.Filter}
}

// dispatchTable returns the table and chain of a dispatch chain.
func (p *planner) dispatchTable(d dispatch) (xtables.Table, string) {
	c := dispatchChains[d]
	return xtables.Table{Family: p.fam, Name: c.table}, p.n.fixed(c.chain)
}

// content returns everything the Proxier wants in its tables for st.
func (px *Proxier) content(st *servicelb.State) (map[xtables.Table]*xtables.TableContent, error) {
	node := st.Node()
	if node.MasqueradeMark() == px.opts.dropMark() {
		return nil, fmt.Errorf("%w: the node's masquerade mark %#x is the drop mark", ErrInvalidOptions, px.opts.dropMark())
	}
	out := map[xtables.Table]*xtables.TableContent{}
	for _, f := range px.opts.Families {
		pl := newPlanner(px.n, f, &node, px.opts.dropMark())
		natT, filterT := familyTables(f)
		nat := &xtables.TableContent{Chains: map[string][]xtables.Rule{}, Keyed: map[string]map[string][]xtables.Rule{}}
		filter := &xtables.TableContent{Chains: map[string][]xtables.Rule{}, Keyed: map[string]map[string][]xtables.Rule{}}
		out[natT], out[filterT] = nat, filter
		nr := pl.nodeRules()
		nat.Jumps, filter.Jumps = nr.jumps[xtables.NAT], nr.jumps[xtables.Filter]
		for _, c := range nr.chains[xtables.NAT] {
			nat.Chains[c.Name] = c.Rules
		}
		for _, c := range nr.chains[xtables.Filter] {
			filter.Chains[c.Name] = c.Rules
		}
		for d := range numDispatch {
			t, chain := pl.dispatchTable(d)
			keys := map[string][]xtables.Rule{}
			out[t].Keyed[chain] = keys
			if len(nr.tails[d]) > 0 {
				keys[tailKey] = nr.tails[d]
			}
		}
		for _, sp := range st.Ports() {
			if sp.Family != f {
				continue
			}
			r := pl.port(sp)
			for _, c := range r.chains {
				nat.Chains[c.Name] = c.Rules
			}
			for d := range numDispatch {
				if len(r.dispatch[d]) > 0 {
					t, chain := pl.dispatchTable(d)
					out[t].Keyed[chain][sp.Key.String()] = r.dispatch[d]
				}
			}
		}
	}
	return out, nil
}

// changes records in tx what the changes of c do to the Proxier's tables.
// The node is the same before and after (a node change goes through a
// full reconcile).
func (px *Proxier) changes(st *servicelb.State, c *servicelb.Changes, tx *xtables.Tx) {
	node := st.Node()
	for _, f := range px.opts.Families {
		pl := newPlanner(px.n, f, &node, px.opts.dropMark())
		for _, sp := range c.Removed {
			if sp.Family == f {
				pl.change(tx, sp, nil)
			}
		}
		for _, sp := range c.Added {
			if sp.Family == f {
				pl.change(tx, nil, sp)
			}
		}
		for _, ch := range c.Changed {
			if ch.New.Family == f {
				pl.change(tx, ch.Old, ch.New)
			}
		}
	}
}

// change records a service port going from old to cur (either may be
// nil): its chains that changed are rewritten, those it no longer uses
// deleted, and its keys in the dispatch chains replaced.
func (p *planner) change(tx *xtables.Tx, old, cur *servicelb.ServicePort) {
	natT := xtables.Table{Family: p.fam, Name: xtables.NAT}
	var was, now portRules
	key := ""
	if old != nil {
		was, key = p.port(old), old.Key.String()
	}
	if cur != nil {
		now, key = p.port(cur), cur.Key.String()
	}
	for _, c := range was.chains {
		if !slices.ContainsFunc(now.chains, func(n xtables.Chain) bool { return n.Name == c.Name }) {
			tx.DeleteChain(natT, c.Name)
		}
	}
	for _, c := range now.chains {
		i := slices.IndexFunc(was.chains, func(o xtables.Chain) bool { return o.Name == c.Name })
		if i < 0 || !reflect.DeepEqual(was.chains[i].Rules, c.Rules) {
			tx.SetChain(natT, c.Name, c.Rules)
		}
	}
	for d := range numDispatch {
		if len(was.dispatch[d]) == 0 && len(now.dispatch[d]) == 0 {
			continue
		}
		t, chain := p.dispatchTable(d)
		tx.SetKeyed(t, chain, key, now.dispatch[d])
	}
}
