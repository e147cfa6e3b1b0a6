package nftables

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// SharedShards returns how many backends maps the proxier's last applied
// state reads from more than one load-balancing chain.
func SharedShards(p *Proxier) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	if p.model != nil {
		for _, c := range p.model.shards {
			if c > 1 {
				n++
			}
		}
	}
	return n
}

// GoldenCases are the states whose renderings testdata holds.
func GoldenCases() map[string]func(t *testing.T) *servicelb.State { return goldenCases() }

// ModelDrift compares the proxier's model with a fresh plan of st and
// describes the first difference: a port planned from an older state, or
// hairpin counts that drifted.
func ModelDrift(p *Proxier, st *servicelb.State) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh, err := p.plan.build(st)
	if err != nil {
		return err.Error()
	}
	if len(fresh.ports) != len(p.model.ports) {
		return fmt.Sprintf("%d ports, fresh %d", len(p.model.ports), len(fresh.ports))
	}
	for k, fp := range fresh.ports {
		if d := portDrift(p.model.ports[k], fp); d != "" {
			return fmt.Sprintf("port %v: %s", k, d)
		}
	}
	for _, m := range []*model{fresh, p.model} {
		for a := range m.hairpin {
			if p.model.hairpin[a] != fresh.hairpin[a] {
				return fmt.Sprintf("hairpin %s: %d, fresh %d", a, p.model.hairpin[a], fresh.hairpin[a])
			}
		}
		for s := range m.shards {
			if p.model.shards[s] != fresh.shards[s] {
				return fmt.Sprintf("shard %s: %d, fresh %d", s.name(), p.model.shards[s], fresh.shards[s])
			}
		}
	}
	return ""
}

func portDrift(a, b *portPlan) string {
	if a == nil {
		return "missing from the model"
	}
	text := func(pp *portPlan) string {
		var s string
		for _, c := range pp.chains {
			s += c.name + "{"
			for _, r := range c.rules {
				s += r.text + ";"
			}
			s += "}"
		}
		for _, set := range slices.Sorted(maps.Keys(pp.elems)) {
			es := pp.elems[set]
			s += set.name() + ":"
			for i := range es {
				s += es[i].id() + string(es[i].data) + es[i].chain + ","
			}
		}
		return s + fmt.Sprint(pp.hairpin, pp.slots, pp.shards)
	}
	if x, y := text(a), text(b); x != y {
		return fmt.Sprintf("model %q, fresh %q", x, y)
	}
	return ""
}
