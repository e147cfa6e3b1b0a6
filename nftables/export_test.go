//go:build linux

package nftables

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// SharedSets returns the shape and bucket sets of the proxier's last
// applied state, by name.
func SharedSets(p *Proxier) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	if p.model != nil {
		for s := range p.model.shared {
			out = append(out, s.name())
		}
	}
	return out
}

// GoldenCases are the states whose renderings testdata holds.
func GoldenCases() map[string]func(t *testing.T) *servicelb.State { return goldenCases() }

// ModelDrift compares the proxier's model with a fresh plan of st and
// describes the first difference: a port planned from an older state, or
// counts of shared elements or maps that drifted.
func ModelDrift(p *Proxier, st *servicelb.State) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh, err := p.plan.build(st)
	if err != nil {
		return err.Error()
	}
	return modelDrift(p.plan, p.model, fresh)
}

// modelDrift describes the first difference between a model kept up to
// date step by step and a fresh one: "" when they plan the same table.
func modelDrift(p *planner, m, fresh *model) string {
	if len(fresh.ports) != len(m.ports) {
		return fmt.Sprintf("%d ports, fresh %d", len(m.ports), len(fresh.ports))
	}
	for k, fp := range fresh.ports {
		if d := portDrift(p, m, fresh, m.ports[k], fp); d != "" {
			return fmt.Sprintf("port %v: %s", k, d)
		}
	}
	for _, x := range []*model{fresh, m} {
		for r := range x.refs.all() {
			if m.refs.get(r) != fresh.refs.get(r) {
				return fmt.Sprintf("%s element %s: %d ports, fresh %d", r.set.name(), r.ref().addr, m.refs.get(r), fresh.refs.get(r))
			}
		}
		for s := range x.shared {
			if m.shared[s] != fresh.shared[s] {
				return fmt.Sprintf("set %s: %d ports, fresh %d", s.name(), m.shared[s], fresh.shared[s])
			}
		}
		for fi := range x.slots.used {
			for s := range x.slots.used[fi] {
				if m.slots.used[fi][s] != fresh.slots.used[fi][s] {
					return fmt.Sprintf("slot %d of family %d: in use %v, fresh %v", s, fi, m.slots.used[fi][s], fresh.slots.used[fi][s])
				}
			}
		}
	}
	if d := nodeDrift(&m.node, &fresh.node); d != "" {
		return d
	}
	return ""
}

func nodeDrift(a, b *nodePlan) string {
	if x, y := chainsText(a.chains)+elemsText(a.elems), chainsText(b.chains)+elemsText(b.elems); x != y {
		return fmt.Sprintf("node: model %q, fresh %q", x, y)
	}
	return ""
}

func chainsText(cs []chainPlan) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.name + "{")
		for _, r := range c.rules {
			b.WriteString(r.text + ";")
		}
		b.WriteString("}")
	}
	return b.String()
}

func elemsText(m map[setID][]elem) string {
	var b strings.Builder
	for _, set := range slices.Sorted(maps.Keys(m)) {
		es := m[set]
		b.WriteString(set.name() + ":")
		for i := range es {
			b.WriteString(es[i].id() + string(es[i].data) + es[i].chain + ",")
		}
	}
	return b.String()
}

func portDrift(p *planner, ma, mb *model, a, b *portPlan) string {
	if a == nil {
		return "missing from the model"
	}
	if a.sp != b.sp && !reflect.DeepEqual(a.sp, b.sp) {
		return fmt.Sprintf("planned from another ServicePort: %v, fresh %v", a.sp, b.sp)
	}
	text := func(m *model, pp *portPlan) string {
		fr := p.fragment(pp, m.cfg)
		return chainsText(fr.chains) + elemsText(fr.allElems()) + fmt.Sprint(refsOf(pp.sp), pp.slot, pp.uses)
	}
	if x, y := text(ma, a), text(mb, b); x != y {
		return fmt.Sprintf("model %q, fresh %q", x, y)
	}
	return ""
}

// RandomOptions are the options of the random states of the table's
// tests (see randomOptions).
func RandomOptions(o servicetest.Options) servicetest.Options { return randomOptions(o) }

// RefuseRules has the kernel refuse the rules the proxier writes for the
// owners refuse chooses, from the next sync on; nil ends it (see
// nfnl.Conn.RefuseRules).
func RefuseRules(p *Proxier, refuse func(owner any) bool) { p.conn.RefuseRules(refuse) }
