//go:build linux

package nftables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// detections are the ways of recognising pods the chains render: none,
// by source (the set), by bridge, by interface name prefix.
var detections = []pods{{}, {set: true}, {iface: "cbr0"}, {iface: "veth", prefix: true}}

// TestEntryRulesRenderEveryVerdict walks every verdict of every origin,
// with every way of recognising pods, and runs the chain entryRules
// render for each kind of source: a pod (a flow the pod match claims, one
// of them from a local address), the node (a local source) and outside.
// Each must meet its origin's action, marked for masquerade exactly when
// its verdict masquerades.
func TestEntryRulesRenderEveryVerdict(t *testing.T) {
	p := newPlanner("kproxy", DefaultAffinitySize)
	lbs := &[2]balancer{{chain: "cluster4"}, {chain: "local4"}}
	var choices []servicelb.Verdict
	for _, a := range []servicelb.Action{servicelb.Reject, servicelb.Drop, servicelb.ToCluster, servicelb.ToLocal} {
		choices = append(choices, servicelb.Verdict{Action: a})
		if a.Forwards() {
			choices = append(choices, servicelb.Verdict{Action: a, Masquerade: true})
		}
	}
	sources := []struct {
		name       string
		pod, local bool
	}{{"pod", true, false}, {"pod on a local address", true, true}, {"node", false, true}, {"outside", false, false}}
	n := 0
	for _, f := range families {
		for _, d := range detections {
			o := p.originRules(nodeDetecting(d), f)
			require.Equal(t, d, o.pods)
			for _, vo := range choices {
				for _, vp := range choices {
					for _, vn := range choices {
						vs := servicelb.Verdicts{vo, vp, vn}
						if !d.detects() {
							vs[servicelb.FromPod] = vo // servicelb's rule without detection
						}
						rules := p.entryRules(o, vs, lbs)
						for _, src := range sources {
							if src.pod && !d.detects() {
								continue
							}
							origin := servicelb.FromOutside
							switch {
							case src.pod:
								origin = servicelb.FromPod
							case src.local:
								origin = servicelb.FromNode
							}
							action, marked := runChain(t, rules, d.match(f, false).text, d.match(f, true).text, src.pod, src.local)
							want := vs[origin]
							if !assert.Equal(t, want.Action, action, "%s, %v, pods %+v: %s\n%s", f, vs, d, src.name, ruleTexts(rules)) ||
								!assert.Equal(t, want.Masquerade, marked && want.Action.Forwards(), "%s, %v, pods %+v: %s marked\n%s", f, vs, d, src.name, ruleTexts(rules)) {
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

// nodeDetecting returns a node whose detection the chains of either
// family render as d.
func nodeDetecting(d pods) *servicelb.NodeConfig {
	n := &servicelb.NodeConfig{}
	switch {
	case d.prefix:
		n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: d.iface}
	case d.iface != "":
		n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: d.iface}
	case d.set:
		n.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/32")}
	}
	return n
}

// runChain runs the rules, given as text, for a packet that the pod
// match (text is and not) claims or not and whose source is local or
// not: the action of the first rule that ends the chain, and whether a
// rule marked the packet first.
func runChain(t *testing.T, rules []*rule, is, not string, pod, local bool) (servicelb.Action, bool) {
	marked := false
	for _, r := range rules {
		text := r.text
		matches := true
		for _, c := range []struct {
			term string
			hit  bool
		}{
			{not, !pod}, {is, pod},
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
		case strings.HasSuffix(text, "goto cluster4"):
			return servicelb.ToCluster, marked
		case strings.HasSuffix(text, "goto local4"):
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
// treated alike, with the masquerade mark for the traffic that is not a
// pod's to a cluster IP; pods are recognised by their source or by the
// interface they come in on, as the node says.
func TestEntryRulesCommonShapes(t *testing.T) {
	p := newPlanner("kproxy", DefaultAffinitySize)
	lbs := &[2]balancer{{chain: "cluster4"}, {chain: "local4"}}
	cluster, masq := servicelb.Verdict{Action: servicelb.ToCluster}, servicelb.Verdict{Action: servicelb.ToCluster, Masquerade: true}
	local := servicelb.Verdict{Action: servicelb.ToLocal}
	reject := servicelb.Verdict{Action: servicelb.Reject}
	bySource, byBridge, byPrefix := pods{set: true}, pods{iface: "cbr0"}, pods{iface: "veth", prefix: true}
	for _, tc := range []struct {
		name string
		f    servicelb.Family
		pods pods
		vs   servicelb.Verdicts
		want []string
	}{
		{"internal", servicelb.IPv4, bySource, servicelb.Verdicts{masq, cluster, masq}, []string{"ip saddr != @pod-cidrs4 jump mark-for-masquerade", "goto cluster4", "drop"}},
		{"masquerade all", servicelb.IPv4, bySource, servicelb.Verdicts{masq, masq, masq}, []string{"jump mark-for-masquerade", "goto cluster4", "drop"}},
		{"no masquerade", servicelb.IPv4, bySource, servicelb.Verdicts{cluster, cluster, cluster}, []string{"goto cluster4", "drop"}},
		{"external local", servicelb.IPv4, bySource, servicelb.Verdicts{local, cluster, masq}, []string{
			"ip saddr != @pod-cidrs4 fib saddr type local jump mark-for-masquerade",
			"ip saddr @pod-cidrs4 goto cluster4", "fib saddr type local goto cluster4", "goto local4", "drop"}},
		{"drop", servicelb.IPv4, bySource, servicelb.Verdicts{{Action: servicelb.Drop}, {Action: servicelb.Drop}, {Action: servicelb.Drop}}, []string{"drop"}},
		{"reject", servicelb.IPv4, bySource, servicelb.Verdicts{}, []string{"reject"}},
		{"internal, bridge", servicelb.IPv6, byBridge, servicelb.Verdicts{masq, cluster, masq}, []string{`iifname != "cbr0" jump mark-for-masquerade`, "goto cluster4", "drop"}},
		{"internal, prefix", servicelb.IPv4, byPrefix, servicelb.Verdicts{masq, cluster, masq}, []string{`iifname != "veth*" jump mark-for-masquerade`, "goto cluster4", "drop"}},
		{"external local, bridge", servicelb.IPv4, byBridge, servicelb.Verdicts{local, cluster, masq}, []string{
			`iifname != "cbr0" fib saddr type local jump mark-for-masquerade`,
			`iifname "cbr0" goto cluster4`, "fib saddr type local goto cluster4", "goto local4", "drop"}},
		{"external local, prefix", servicelb.IPv6, byPrefix, servicelb.Verdicts{local, cluster, masq}, []string{
			`iifname != "veth*" fib saddr type local jump mark-for-masquerade`,
			`iifname "veth*" goto cluster4`, "fib saddr type local goto cluster4", "goto local4", "drop"}},
		{"pods rejected by source", servicelb.IPv6, bySource, servicelb.Verdicts{cluster, reject, cluster}, []string{
			"ip6 saddr @pod-cidrs6 reject with icmpv6 port-unreachable", "goto cluster4", "drop"}},
		{"pods rejected by interface", servicelb.IPv6, byPrefix, servicelb.Verdicts{cluster, reject, cluster}, []string{
			`iifname "veth*" reject`, "goto cluster4", "drop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := p.entryRules(p.originRules(nodeDetecting(tc.pods), tc.f), tc.vs, lbs)
			require.Equal(t, tc.want, strings.Split(strings.TrimSpace(strings.ReplaceAll(ruleTexts(rs), "\t", "")), "\n"))
		})
	}
}
