//go:build linux

package nftables

import (
	"cmp"
	"context"
	"fmt"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.Tracer = (*Proxier)(nil)

// Trace follows the first packet of the next new flow of f through the
// table (see servicelb.Tracer). While it waits, a table of its own beside
// the proxier's, named after it with "-trace", marks such packets for
// nf_tables' trace events; it is removed when Trace returns. Each step
// names the rule as Render writes it. Syncs go on meanwhile.
func (p *Proxier) Trace(ctx context.Context, f servicelb.Flow) (servicelb.Trace, error) {
	p.mu.Lock()
	closed, render := p.eng.Closed(), p.conn == nil
	p.mu.Unlock()
	switch {
	case closed:
		return servicelb.Trace{}, ErrClosed
	case render:
		return servicelb.Trace{}, fmt.Errorf("nftables: trace: %w", ErrRenderOnly)
	}
	m := nfnl.TraceMatch{Src: f.Src.Addr(), Dst: f.Dst, Proto: cmp.Or(f.Protocol, servicelb.TCP).Number()}
	evs, err := nfnl.TraceOnce(ctx, nfnl.Options{NetNS: int(p.opts.NetNS)}, p.opts.Table+"-trace", m)
	if err != nil {
		return servicelb.Trace{}, fmt.Errorf("nftables: trace: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := servicelb.Trace{Backend: "nftables"}
	texts := map[string]map[uint64]string{} // by chain, then handle
	for _, ev := range evs {
		if ev.Family != nfnl.Inet || ev.Table != p.opts.Table {
			continue
		}
		step := servicelb.TraceStep{Table: "inet " + ev.Table, Chain: ev.Chain, Verdict: ev.VerdictText()}
		if ev.Type == nfnl.TraceRule && !ev.ChainEnd() {
			byHandle, ok := texts[ev.Chain]
			if !ok {
				if byHandle, err = p.ruleTexts(ctx, ev.Chain); err != nil {
					return out, fmt.Errorf("nftables: trace: %w", err)
				}
				texts[ev.Chain] = byHandle
			}
			step.Rule = cmp.Or(byHandle[ev.Handle], fmt.Sprintf("#%d", ev.Handle))
		}
		out.Steps = append(out.Steps, step)
	}
	return out, nil
}

// ruleTexts reads a chain's rules and names each by handle with its
// planned rule at the same place, when the chain holds as many rules as
// planned; else it names none.
func (p *Proxier) ruleTexts(ctx context.Context, chain string) (map[uint64]string, error) {
	rs, err := p.conn.RulesRaw(ctx, nfnl.Inet, p.opts.Table, chain)
	if err != nil {
		return nil, err
	}
	planned := p.plannedTexts(chain)
	out := make(map[uint64]string, len(rs))
	if len(rs) == len(planned) {
		for i, r := range rs {
			out[r.Handle] = planned[i]
		}
	}
	return out, nil
}

// plannedTexts returns the texts of a chain's planned rules: a chain no
// port owns, or of the port whose chains include it.
func (p *Proxier) plannedTexts(chain string) []string {
	m := p.model
	if m == nil {
		return nil
	}
	texts := func(cs []chainPlan) []string {
		for _, c := range cs {
			if c.name == chain {
				out := make([]string, len(c.rules))
				for i, r := range c.rules {
					out[i] = r.text
				}
				return out
			}
		}
		return nil
	}
	if t := texts(p.plan.nodeChains(m)); t != nil {
		return t
	}
	for _, pp := range m.ports {
		found := false
		chainNames(pp, func(name string) { found = found || name == chain })
		if found {
			return texts(p.plan.fragment(pp, m.cfg).chains)
		}
	}
	return nil
}
