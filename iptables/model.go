//go:build linux

package iptables

import (
	"fmt"
	"iter"
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

// tableWriter records changes to the Proxier's tables: an *xtables.Tx,
// which an Applier commits in one batch.
type tableWriter interface {
	SetOwner(owner any)
	SetChain(t xtables.Table, name string, rules []xtables.Rule)
	DeleteChain(t xtables.Table, name string)
	SetKeyed(t xtables.Table, chain, key string, rules []xtables.Rule)
}

var _ tableWriter = (*xtables.Tx)(nil)

// checkPorts reports the first service port of the Proxier's families
// that its capabilities refuse, with servicelb's error unchanged.
func (px *Proxier) checkPorts(ports ...*servicelb.ServicePort) error {
	caps := px.Capabilities()
	for _, sp := range ports {
		if !slices.Contains(px.opts.Families, sp.Family) {
			continue
		}
		if err := caps.CheckPort(sp); err != nil {
			return err
		}
	}
	return nil
}

// checkNode refuses a node the Proxier's capabilities cannot serve and
// one whose masquerade mark is the drop mark.
func (px *Proxier) checkNode(node *servicelb.NodeConfig) error {
	caps := px.Capabilities()
	if err := caps.CheckNode(node); err != nil {
		return err
	}
	if node.MasqueradeMark() == px.opts.dropMark() {
		return fmt.Errorf("%w: the node's masquerade mark %#x is the drop mark", ErrInvalidOptions, px.opts.dropMark())
	}
	return nil
}

// content returns everything the Proxier wants in its tables for st.
func (px *Proxier) content(st *servicelb.State) (map[xtables.Table]*xtables.TableContent, error) {
	node := st.Node()
	return px.portsContent(&node, st.Ports())
}

// portsContent returns everything the Proxier wants in its tables for
// service ports on a node.
func (px *Proxier) portsContent(node *servicelb.NodeConfig, ports []*servicelb.ServicePort) (map[xtables.Table]*xtables.TableContent, error) {
	if err := px.checkNode(node); err != nil {
		return nil, err
	}
	if err := px.checkPorts(ports...); err != nil {
		return nil, err
	}
	out := map[xtables.Table]*xtables.TableContent{}
	for _, f := range px.opts.Families {
		pl := newPlanner(px.n, f, node, &px.opts)
		natT, filterT := familyTables(f)
		out[natT], out[filterT] = pl.nodeContent()
		out[natT].Parts = pl.portChains(ports)
		byService := map[string][]*servicelb.ServicePort{}
		for _, sp := range ports {
			if sp.Family != f {
				continue
			}
			byService[sp.Key.Service] = append(byService[sp.Key.Service], sp)
			var owner any = sp.Key
			r := pl.dispatchRules(pl.plan(sp))
			for d := range numDispatch {
				if len(r.dispatch[d]) > 0 {
					t, chain := pl.dispatchTable(d)
					out[t].Keyed[chain][sp.Key.String()] = r.dispatch[d]
					out[t].KeyOwners[sp.Key.String()] = owner
				}
			}
		}
		_, services := pl.dispatchTable(filterServices)
		for svc, sps := range byService {
			if rules := pl.clusterIPRules(svc, sps); len(rules) > 0 {
				out[filterT].Keyed[services][clusterIPKey(svc)] = rules
				out[filterT].KeyOwners[clusterIPKey(svc)] = serviceOwner(svc, f)
			}
		}
	}
	return out, nil
}

// portChains yields the own chains of each port of the planner's family,
// with the port's key as their owner, a port at a time, planned as they
// are asked for and in room reused for the next port: a cold sync of many
// ports never holds all their rules at once beside their encoding, nor
// leaves them all behind as garbage.
func (p *planner) portChains(ports []*servicelb.ServicePort) iter.Seq2[any, []xtables.Chain] {
	return func(yield func(any, []xtables.Chain) bool) {
		q := *p
		q.buf, q.arena = nil, &arena{seps: map[string]servicelb.Backend{}}
		for _, sp := range ports {
			if sp.Family == q.family && !yield(sp.Key, q.chains(q.plan(sp))) {
				return
			}
		}
	}
}

// serviceOwner is the owner of what a service has rather than one of its
// ports (its cluster IPs' rules in the filter table's services chain): a
// key of the service alone, which names the service in a refusal.
func serviceOwner(svc string, f servicelb.Family) any {
	return servicelb.ServicePortKey{Service: svc, Family: f}
}

// nodeContent returns the nat and filter content of the node's own rules,
// with every dispatch chain present.
func (p *planner) nodeContent() (nat, filter *xtables.TableContent) {
	nat = &xtables.TableContent{Chains: map[string][]xtables.Rule{}, Keyed: map[string]map[string][]xtables.Rule{},
		ChainOwners: map[string]any{}, KeyOwners: map[string]any{}}
	filter = &xtables.TableContent{Chains: map[string][]xtables.Rule{}, Keyed: map[string]map[string][]xtables.Rule{},
		ChainOwners: map[string]any{}, KeyOwners: map[string]any{}}
	byName := map[xtables.TableName]*xtables.TableContent{xtables.NAT: nat, xtables.Filter: filter}
	nr := p.nodeRules()
	for name, tc := range byName {
		tc.Jumps = nr.jumps[name]
		for _, c := range nr.chains[name] {
			tc.Chains[c.Name] = c.Rules
		}
	}
	for d := range numDispatch {
		t, chain := p.dispatchTable(d)
		keys := map[string][]xtables.Rule{}
		byName[t.Name].Keyed[chain] = keys
		if len(nr.tails[d]) > 0 {
			keys[tailKey] = nr.tails[d]
		}
	}
	return nat, filter
}

// changes records in w what the changes of c do to the Proxier's tables,
// or fails, recording nothing, when a new or changed port does not fit
// the Proxier's capabilities. The node is the same before and after (a
// node change goes through a full reconcile).
func (px *Proxier) changes(st *servicelb.State, c *servicelb.Changes, w tableWriter) error {
	for _, ch := range c.Changed {
		if err := px.checkPorts(ch.New); err != nil {
			return err
		}
	}
	if err := px.checkPorts(c.Added...); err != nil {
		return err
	}
	node := st.Node()
	for _, f := range px.opts.Families {
		pl := newPlanner(px.n, f, &node, &px.opts)
		var services []string
		change := func(old, cur *servicelb.ServicePort) {
			sp := either(cur, old)
			if sp.Family == f {
				pl.change(w, old, cur)
				services = append(services, sp.Key.Service)
			}
		}
		for _, sp := range c.Removed {
			change(sp, nil)
		}
		for _, sp := range c.Added {
			change(nil, sp)
		}
		for _, ch := range c.Changed {
			change(ch.Old, ch.New)
		}
		slices.Sort(services)
		t, chain := pl.dispatchTable(filterServices)
		for _, svc := range slices.Compact(services) {
			w.SetOwner(serviceOwner(svc, f))
			w.SetKeyed(t, chain, clusterIPKey(svc), pl.clusterIPRules(svc, st.ServicePorts(svc)))
		}
		w.SetOwner(nil)
	}
	return nil
}

func either(a, b *servicelb.ServicePort) *servicelb.ServicePort {
	if a != nil {
		return a
	}
	return b
}

// change records a service port going from old to cur (either may be
// nil): its chains that changed are rewritten, those it no longer uses
// deleted, and its keys in the dispatch chains replaced.
func (p *planner) change(w tableWriter, old, cur *servicelb.ServicePort) {
	natT := xtables.Table{Family: p.fam, Name: xtables.NAT}
	var was, now portRules
	key := ""
	if old != nil {
		was, key = p.port(old), old.Key.String()
	}
	if cur != nil {
		now, key = p.port(cur), cur.Key.String()
	}
	w.SetOwner(either(cur, old).Key)
	for _, c := range was.chains {
		if !slices.ContainsFunc(now.chains, func(n xtables.Chain) bool { return n.Name == c.Name }) {
			w.DeleteChain(natT, c.Name)
		}
	}
	for _, c := range now.chains {
		i := slices.IndexFunc(was.chains, func(o xtables.Chain) bool { return o.Name == c.Name })
		if i < 0 || !reflect.DeepEqual(was.chains[i].Rules, c.Rules) {
			w.SetChain(natT, c.Name, c.Rules)
		}
	}
	for d := range numDispatch {
		if len(was.dispatch[d]) == 0 && len(now.dispatch[d]) == 0 {
			continue
		}
		t, chain := p.dispatchTable(d)
		w.SetKeyed(t, chain, key, now.dispatch[d])
	}
}
