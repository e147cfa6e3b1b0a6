//go:build linux

package iptables

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.Tracer = (*Proxier)(nil)

// traceTable is the table of family inet that marks the packets a Trace
// follows, while it waits.
const traceTable = "kproxy-iptables-trace"

// Trace follows the first packet of the next new flow of f through the
// proxier's chains (see servicelb.Tracer): iptables-nft's tables are
// nf_tables tables, whose trace events name each rule a packet meets.
// While it waits, a table of its own (family inet, traceTable) marks such
// packets; it is removed when Trace returns. The steps are those in the
// proxier's chains and the jumps to them from the builtin chains, each
// rule as iptables-save writes it. Syncs go on meanwhile.
func (px *Proxier) Trace(ctx context.Context, f servicelb.Flow) (servicelb.Trace, error) {
	px.mu.Lock()
	eng := px.eng
	closed := eng != nil && eng.Closed()
	px.mu.Unlock()
	switch {
	case eng == nil:
		return servicelb.Trace{}, fmt.Errorf("iptables: trace: %w", ErrRenderOnly)
	case closed:
		return servicelb.Trace{}, ErrClosed
	}
	m := nfnl.TraceMatch{Src: f.Src.Addr(), Dst: f.Dst, Proto: cmp.Or(f.Protocol, servicelb.TCP).Number()}
	evs, err := nfnl.TraceOnce(ctx, nfnl.Options{NetNS: int(px.opts.NetNS)}, traceTable, m)
	if err != nil {
		return servicelb.Trace{}, fmt.Errorf("iptables: trace: %w", err)
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	out := servicelb.Trace{Backend: "iptables"}
	st := px.eng.Applied()
	if st == nil {
		return out, nil
	}
	want, err := px.content(st)
	if err != nil {
		return out, fmt.Errorf("iptables: trace: %w", err)
	}
	texts := map[xtables.Table]map[string]map[uint64]string{}
	for _, ev := range evs {
		fam, ok := map[nfnl.Family]xtables.Family{nfnl.IPv4: xtables.IPv4, nfnl.IPv6: xtables.IPv6}[ev.Family]
		if !ok || !(px.n.owns(ev.Chain) || ev.Verdict.Chain != "" && px.n.owns(ev.Verdict.Chain)) {
			continue
		}
		t := xtables.Table{Family: fam, Name: xtables.TableName(ev.Table)}
		step := servicelb.TraceStep{Table: t.String(), Chain: ev.Chain, Verdict: ev.VerdictText()}
		if ev.Type == nfnl.TraceRule && !ev.ChainEnd() {
			if texts[t] == nil {
				texts[t] = map[string]map[uint64]string{}
			}
			byHandle, ok := texts[t][ev.Chain]
			if !ok {
				if byHandle, err = px.ap.RuleTexts(ctx, t, ev.Chain, planned(want[t], ev.Chain)); err != nil {
					return out, fmt.Errorf("iptables: trace: %w", err)
				}
				texts[t][ev.Chain] = byHandle
			}
			step.Rule = cmp.Or(byHandle[ev.Handle], fmt.Sprintf("#%d", ev.Handle))
		}
		out.Steps = append(out.Steps, step)
	}
	return out, nil
}

// planned returns the rules tc plans in a chain: a whole chain's, a keyed
// chain's in key order, or the jumps at the top of a builtin chain.
func planned(tc *xtables.TableContent, chain string) []xtables.Rule {
	if tc == nil {
		return nil
	}
	if rs, ok := tc.Chains[chain]; ok {
		return rs
	}
	if keys, ok := tc.Keyed[chain]; ok {
		var out []xtables.Rule
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			out = append(out, keys[k]...)
		}
		return out
	}
	if rs, ok := tc.Jumps[chain]; ok {
		return rs
	}
	if tc.Parts != nil {
		for _, group := range tc.Parts {
			for _, c := range group {
				if c.Name == chain {
					// A copy: the producer reuses a group's room.
					return slices.Clone(c.Rules)
				}
			}
		}
	}
	return nil
}
