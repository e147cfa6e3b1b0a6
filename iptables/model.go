//go:build linux

package iptables

import (
	"iter"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// familyTables returns the nat and filter tables of a family.
func familyTables(f servicelb.Family) (nat, filter xtables.Table) {
	return xtables.Table{Family: xfam(f), Name: xtables.NAT}, xtables.Table{Family: xfam(f), Name: xtables.Filter}
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
