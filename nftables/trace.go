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
	texts := map[string][]string{}
	for _, ev := range evs {
		if ev.Family != nfnl.Inet || ev.Table != p.opts.Table {
			continue
		}
		step := servicelb.TraceStep{Table: "inet " + ev.Table, Chain: ev.Chain, Verdict: ev.VerdictText()}
		if ev.Type == nfnl.TraceRule && !ev.ChainEnd() {
			if step.Rule, err = p.ruleText(ctx, texts, ev.Chain, ev.Handle); err != nil {
				return out, fmt.Errorf("nftables: trace: %w", err)
			}
		}
		out.Steps = append(out.Steps, step)
	}
	return out, nil
}

// ruleText returns the text of the rule of chain with handle: its
// planned rule at the same place, when the chain holds as many rules as
// planned; else "#<handle>". texts caches each chain's texts by place.
func (p *Proxier) ruleText(ctx context.Context, texts map[string][]string, chain string, handle uint64) (string, error) {
	rs, err := p.conn.RulesRaw(ctx, nfnl.Inet, p.opts.Table, chain)
	if err != nil {
		return "", err
	}
	planned, ok := texts[chain]
	if !ok {
		planned = p.plannedTexts(chain)
		texts[chain] = planned
	}
	for i, r := range rs {
		if r.Handle == handle && len(rs) == len(planned) {
			return planned[i], nil
		}
	}
	return fmt.Sprintf("#%d", handle), nil
}

// plannedTexts returns the texts of a chain's planned rules: a chain of
// the node's, or of the port whose chains include it.
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
	if t := texts(m.node.chains); t != nil {
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
