//go:build linux

package iptables

import (
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.FlowChecker = (*Proxier)(nil)

// CheckFlow reads back from the kernel what serves the flow e explains,
// in the nat and filter tables of the flow's family: the node's chains
// and its jumps from the builtin chains, and, for a flow that hits a
// frontend, the chains of its service's ports (the service, external,
// firewall, policy and endpoint chains) with their rules in the dispatch
// chains. It compares them with what the explanation's own ServicePort
// plans, and reports every chain or rule missing or changed.
func (px *Proxier) CheckFlow(ctx context.Context, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	px.mu.Lock()
	defer px.mu.Unlock()
	switch {
	case px.eng == nil:
		return servicelb.KernelCheck{}, fmt.Errorf("iptables: check a flow: %w", ErrRenderOnly)
	case px.eng.Closed():
		return servicelb.KernelCheck{}, ErrClosed
	}
	out := servicelb.KernelCheck{Backend: "iptables"}
	sp, why := px.eng.Explained(e)
	if why != "" {
		out.Differences = append(out.Differences, why)
		return out, nil
	}
	st := px.eng.Applied()
	node := st.Node()
	var ports []*servicelb.ServicePort
	if sp != nil {
		// Every port of the service of the family: the service's cluster
		// IP rules are made of them all.
		for _, p := range st.Ports() {
			if p.Key.Service == sp.Key.Service && p.Family == sp.Family {
				ports = append(ports, p)
			}
		}
	}
	// The dispatch chains are compared whole, every port's rules in them
	// (a foreign rule anywhere is in the way); of the ports' own chains,
	// those of the service's ports.
	all, err := px.content(st)
	if err != nil {
		return out, fmt.Errorf("iptables: check a flow: %w", err)
	}
	own, err := px.portsContent(&node, ports)
	if err != nil {
		return out, fmt.Errorf("iptables: check a flow: %w", err)
	}
	wanted := map[string]bool{tailKey: true}
	for _, p := range ports {
		wanted[p.Key.String()] = true
		wanted[clusterIPKey(p.Key.Service)] = true
	}
	f := servicelb.FamilyOf(e.Flow.Dst.Addr())
	want := map[xtables.Table]*xtables.TableContent{}
	for t, tc := range all {
		if t.Family == xfam(f) {
			tc.Parts = own[t].Parts
			want[t] = tc
		}
	}
	if len(want) == 0 {
		out.Differences = append(out.Differences, fmt.Sprintf("the proxier programs no %s tables (Options.Families)", f))
		return out, nil
	}
	out.Read, out.Differences, err = px.ap.CompareKeys(ctx, want, func(key string) bool { return wanted[key] })
	if err != nil {
		return out, fmt.Errorf("iptables: check a flow: %w", err)
	}
	return out, nil
}
