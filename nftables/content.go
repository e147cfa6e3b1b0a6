package nftables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// content is a whole table, in the order it is declared and created: sets
// first, then chains.
type content struct {
	sets   []setDef
	elems  map[string][]elem
	chains []chainPlan
}

func (p *planner) content(m *model) *content {
	c := &content{elems: map[string][]elem{}}
	for _, f := range families {
		c.sets = append(c.sets, fixedSets(p.table, f, p.affinitySize)...)
	}
	for _, s := range slices.Sorted(maps.Keys(m.shards)) {
		c.sets = append(c.sets, backendsDef(p.table, shardFamily(s), s))
	}
	add := func(es map[string][]elem) {
		for set, e := range es {
			c.elems[set] = append(c.elems[set], e...)
		}
	}
	add(m.node.elems)
	c.chains = append(c.chains, m.node.chains...)
	for _, pp := range m.sortedPorts() {
		add(pp.elems)
		c.chains = append(c.chains, pp.chains...)
	}
	for _, a := range slices.SortedFunc(maps.Keys(m.hairpin), netip.Addr.Compare) {
		set := setName(setHairpin, servicelb.FamilyOf(a))
		c.elems[set] = append(c.elems[set], hairpinElem(a))
	}
	for _, es := range c.elems {
		sortElems(es)
	}
	return c
}

// render writes the table as nft text that `nft -f` loads.
func (c *content) render(table string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", table)
	for _, d := range c.sets {
		setText(d, c.elems[d.set.Name], &b)
	}
	for _, ch := range c.chains {
		fmt.Fprintf(&b, "\tchain %s {\n", ch.name)
		if h := ch.hook; h != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", h.Type, hookName(h.Num), h.Priority)
		}
		for _, r := range ch.rules {
			fmt.Fprintf(&b, "\t\t%s\n", r.text)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func hookName(n uint32) string {
	switch n {
	case nfnl.HookPrerouting:
		return "prerouting"
	case nfnl.HookInput:
		return "input"
	case nfnl.HookForward:
		return "forward"
	case nfnl.HookOutput:
		return "output"
	case nfnl.HookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", n)
}

// create writes the whole content into a batch: sets, chains, rules and
// elements, in that order.
func (c *content) create(table string, b *nfnl.Batch) {
	for _, d := range c.sets {
		b.AddSet(d.set)
	}
	for _, ch := range c.chains {
		b.AddChain(nfnl.Chain{Family: nfnl.Inet, Table: table, Name: ch.name, Hook: ch.hook})
	}
	for _, ch := range c.chains {
		for _, r := range ch.rules {
			b.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: table, Chain: ch.name, Exprs: r.exprs})
		}
	}
	for _, d := range c.sets {
		if es := c.elems[d.set.Name]; len(es) > 0 {
			b.AddElements(nfnl.Inet, table, d.set.Name, insertOrder(es))
		}
	}
}
