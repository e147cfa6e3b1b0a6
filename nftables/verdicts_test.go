package nftables

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestEntryRulesRenderEveryVerdict walks every verdict of every origin,
// with and without cluster CIDRs, and runs the chain entryRules render
// for each kind of source: a pod (a source in the cluster CIDRs, one of
// them a local address), the node (a local source) and outside. Each must
// meet its origin's action, marked for masquerade exactly when its
// verdict masquerades.
func TestEntryRulesRenderEveryVerdict(t *testing.T) {
	p := newPlanner("kproxy", DefaultAffinitySize)
	lbs := map[servicelb.Action]balancer{
		servicelb.ToCluster: {dnat: []term{{text: "to-cluster"}}},
		servicelb.ToLocal:   {dnat: []term{{text: "to-local"}}},
	}
	var choices []servicelb.Verdict
	for _, a := range []servicelb.Action{servicelb.Reject, servicelb.Drop, servicelb.ToCluster, servicelb.ToLocal} {
		choices = append(choices, servicelb.Verdict{Action: a})
		if a.Forwards() {
			choices = append(choices, servicelb.Verdict{Action: a, Masquerade: true})
		}
	}
	sources := []struct {
		name           string
		inCIDRs, local bool
	}{{"pod", true, false}, {"pod on a local address", true, true}, {"node", false, true}, {"outside", false, false}}
	n := 0
	for _, f := range families {
		for _, pods := range []bool{true, false} {
			for _, vo := range choices {
				for _, vp := range choices {
					for _, vn := range choices {
						vs := servicelb.Verdicts{vo, vp, vn}
						if !pods {
							vs[servicelb.FromPod] = vo // servicelb's rule without cluster CIDRs
						}
						rules := p.entryRules(f, vs, pods, lbs)
						for _, src := range sources {
							if src.inCIDRs && !pods {
								continue
							}
							origin := servicelb.FromOutside
							switch {
							case src.inCIDRs:
								origin = servicelb.FromPod
							case src.local:
								origin = servicelb.FromNode
							}
							action, marked := runChain(t, rules, src.inCIDRs, src.local)
							want := vs[origin]
							if !assert.Equal(t, want.Action, action, "%s, %v, cluster CIDRs %v: %s\n%s", f, vs, pods, src.name, ruleTexts(rules)) ||
								!assert.Equal(t, want.Masquerade, marked && want.Action.Forwards(), "%s, %v, cluster CIDRs %v: %s marked\n%s", f, vs, pods, src.name, ruleTexts(rules)) {
								return
							}
							n++
						}
					}
				}
			}
		}
	}
	t.Logf("%d cases", n)
}

// runChain runs the rules, given as text, for a packet whose source is
// in the cluster CIDRs or not and local or not: the action of the first
// rule that ends the chain, and whether a rule marked the packet first.
func runChain(t *testing.T, rules []*rule, inCIDRs, local bool) (servicelb.Action, bool) {
	marked := false
	for _, r := range rules {
		text := r.text
		matches := true
		for _, c := range []struct {
			term string
			hit  bool
		}{
			{"saddr != @cluster-cidrs", !inCIDRs}, {"saddr @cluster-cidrs", inCIDRs},
			{"fib saddr type != local", !local}, {"fib saddr type local", local},
		} {
			if strings.Contains(text, c.term) {
				matches = matches && c.hit
				text = strings.Replace(text, c.term, "", 1)
			}
		}
		if !matches {
			continue
		}
		switch {
		case strings.HasSuffix(text, "jump "+chainMarkMasq):
			marked = true
			continue
		case strings.HasSuffix(text, "to-cluster"):
			return servicelb.ToCluster, marked
		case strings.HasSuffix(text, "to-local"):
			return servicelb.ToLocal, marked
		case strings.HasSuffix(text, "drop"):
			return servicelb.Drop, marked
		case strings.Contains(text, "reject"):
			return servicelb.Reject, marked
		}
		t.Fatalf("rule %q neither marks nor ends the chain", r.text)
	}
	t.Fatalf("no rule ends the chain:\n%s", ruleTexts(rules))
	return 0, false
}

func ruleTexts(rs []*rule) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString("\t" + r.text + "\n")
	}
	return b.String()
}

// TestEntryRulesCommonShapes: the verdicts servicelb gives render as few
// rules as before: one balancing rule per chain when every origin is
// treated alike, with the masquerade mark for the traffic from outside
// the cluster CIDRs to a cluster IP.
func TestEntryRulesCommonShapes(t *testing.T) {
	p := newPlanner("kproxy", DefaultAffinitySize)
	lbs := map[servicelb.Action]balancer{
		servicelb.ToCluster: {dnat: []term{{text: "to-cluster"}}},
		servicelb.ToLocal:   {dnat: []term{{text: "to-local"}}},
	}
	cluster, masq := servicelb.Verdict{Action: servicelb.ToCluster}, servicelb.Verdict{Action: servicelb.ToCluster, Masquerade: true}
	local := servicelb.Verdict{Action: servicelb.ToLocal}
	for _, tc := range []struct {
		name string
		vs   servicelb.Verdicts
		want []string
	}{
		{"internal", servicelb.Verdicts{masq, cluster, masq}, []string{"ip saddr != @cluster-cidrs4 jump mark-for-masquerade", "to-cluster", "drop"}},
		{"masquerade all", servicelb.Verdicts{masq, masq, masq}, []string{"jump mark-for-masquerade", "to-cluster", "drop"}},
		{"no masquerade", servicelb.Verdicts{cluster, cluster, cluster}, []string{"to-cluster", "drop"}},
		{"external local", servicelb.Verdicts{local, cluster, masq}, []string{
			"ip saddr != @cluster-cidrs4 fib saddr type local jump mark-for-masquerade",
			"ip saddr @cluster-cidrs4 to-cluster", "fib saddr type local to-cluster", "to-local", "drop"}},
		{"drop", servicelb.Verdicts{{Action: servicelb.Drop}, {Action: servicelb.Drop}, {Action: servicelb.Drop}}, []string{"drop"}},
		{"reject", servicelb.Verdicts{}, []string{"reject"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := p.entryRules(servicelb.IPv4, tc.vs, true, lbs)
			require.Equal(t, tc.want, strings.Split(strings.TrimSpace(strings.ReplaceAll(ruleTexts(rs), "\t", "")), "\n"))
		})
	}
}
