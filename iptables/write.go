//go:build linux

package iptables

import (
	"reflect"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/sysctl"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// routeLocalnet sets net.ipv4.conf.all.route_localnet in the Proxier's
// namespace when the node serves node ports on localhost
// (NodeConfig.ServesLocalhost): without it the kernel drops a flow from
// 127.0.0.1 once it is translated to an endpoint on another host. It
// never clears the setting, which others may need.
func (px *Proxier) routeLocalnet(st *servicelb.State) error {
	if n := st.Node(); !n.ServesLocalhost() || !slices.Contains(px.opts.Families, servicelb.IPv4) {
		return nil
	}
	ns := px.opts.NetNS
	if ns < 0 {
		ns = 0
	}
	changed, err := sysctl.Apply(ns, []sysctl.Setting{{Name: "net.ipv4.conf.all.route_localnet", Value: "1"}})
	for _, c := range changed {
		px.log.Info("sysctl set for localhost node ports", "sysctl", c.Name, "value", c.Value, "was", c.Old)
	}
	return err
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
