//go:build linux

package nftables

import (
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// A port's entry chain renders the verdicts of one kind of frontend. A
// chain tells origins apart as servicelb does: a pod as the node's
// local-traffic detection recognises it (servicelb.NodeConfig.LocalMatch:
// a source in the set pod-cidrs4/6, or the input interface's name), else
// the node by a local source ("fib saddr type local"), else outside. It
// first marks for masquerade the traffic of the origins whose verdict
// masquerades, then sends each origin to its action: the origins whose
// action differs from outside's first (pods, then the node), and
// outside's as the fall-through.

// pods is how the chains of one family recognise a pod's flows: by a
// source in the set pod-cidrs4/6 (set), or by the name of the interface
// they came in on (iface, a prefix of it when prefix). The zero value
// recognises none.
type pods struct {
	set    bool
	iface  string
	prefix bool
}

// podsOf returns how the node's pods are recognised in family f.
func podsOf(n *servicelb.NodeConfig, f servicelb.Family) pods {
	m := n.LocalMatch(f)
	if m.Interface != "" {
		return pods{iface: m.Interface, prefix: m.Prefix}
	}
	return pods{set: len(m.CIDRs) > 0}
}

// detects reports whether any flow is recognised as a pod's.
func (d pods) detects() bool { return d.set || d.iface != "" }

// match returns the terms that match a pod's flows in family f or,
// negated, every other flow: "ip saddr @pod-cidrs4", `iifname "cbr0"`,
// `iifname != "veth*"`.
func (d pods) match(f servicelb.Family, negate bool) term {
	if d.iface != "" {
		return iifname(d.iface, d.prefix, negate)
	}
	return inSet(f, true, negate, fixedSet(kindPodCIDRs, f).name())
}

// originRules are the rules that the entry chains of one family and one
// way of recognising pods share: by the set of origins (a bit per
// origin), the rules that mark those origins' traffic for masquerade; by
// origin, the rules that drop (0) and reject (1) its traffic.
type originRules struct {
	f     servicelb.Family
	pods  pods
	marks [1 << origins][]*rule
	ends  [origins][2]*rule
	// match holds, encoded, the terms that match each origin.
	match [origins][]term
}

func newOriginRules(f servicelb.Family, d pods) *originRules {
	o := &originRules{f: f, pods: d}
	for mask := range 1 << origins {
		o.marks[mask] = markRules(f, mask, d)
	}
	for _, origin := range servicelb.Origins() {
		match := originTerms(f, d, origin)
		for i := range match {
			match[i] = encoded(match[i])
		}
		o.match[origin] = match
		o.ends[origin][0] = mk(append(match, drop())...)
		o.ends[origin][1] = mk(append(match, reject(contextFamily(f, d, origin)))...)
	}
	return o
}

// entryRules renders verdicts vs in a chain whose origins o tells apart;
// lbs are the port's balancers over its cluster set (0) and local set (1).
func (p *planner) entryRules(o *originRules, vs servicelb.Verdicts, lbs *[2]balancer) []*rule {
	mask := 0
	for o, v := range vs {
		if v.Masquerade {
			mask |= 1 << o
		}
	}
	marks := o.marks[mask]
	rs := make([]*rule, 0, len(marks)+origins+1)
	rs = append(rs, marks...)
	for _, origin := range routes(vs, o.pods.detects()) {
		a := vs[origin].Action
		switch {
		case a == servicelb.ToCluster:
			rs = append(rs, lbs[0].rule(o.match[origin]...))
		case a == servicelb.ToLocal:
			rs = append(rs, lbs[1].rule(o.match[origin]...))
		case a == servicelb.Reject:
			rs = append(rs, o.ends[origin][1])
		default:
			rs = append(rs, o.ends[origin][0])
		}
	}
	if vs[servicelb.FromOutside].Action.Forwards() {
		// A balancer that finds no endpoint must not let the flow past
		// untranslated.
		rs = append(rs, p.drop)
	}
	return rs
}

// routes returns the origins whose action a chain tests, in order: pods
// (when some flow is recognised as a pod's) and the node when their
// action differs from outside's, and outside, the fall-through, last.
// Pods are also tested when the node is and their actions differ, since a
// pod's source may be a local address (a node's address in the cluster
// CIDRs).
func routes(vs servicelb.Verdicts, pods bool) []servicelb.Origin {
	out, pod, node := vs[servicelb.FromOutside].Action, vs[servicelb.FromPod].Action, vs[servicelb.FromNode].Action
	os := make([]servicelb.Origin, 0, origins)
	if pods && (pod != out || (node != out && pod != node)) {
		os = append(os, servicelb.FromPod)
	}
	if node != out {
		os = append(os, servicelb.FromNode)
	}
	return append(os, servicelb.FromOutside)
}

// originTerms match an origin in a chain that tests the origins in the
// order of routes: a pod as d recognises it, the node by a local source,
// and outside by nothing (it is what remains).
func originTerms(f servicelb.Family, d pods, o servicelb.Origin) []term {
	switch o {
	case servicelb.FromPod:
		return []term{d.match(f, false)}
	case servicelb.FromNode:
		return []term{fibLocal(true)}
	}
	return nil
}

// contextFamily is the family that the terms matching origin o name, as
// nft sees it when it encodes a reject after them; 0 for none. A source
// address names the family; an interface does not.
func contextFamily(f servicelb.Family, d pods, o servicelb.Origin) servicelb.Family {
	if o == servicelb.FromPod && d.set {
		return f
	}
	return 0
}

// originTest is a condition on a packet's origin: whether it is a pod's
// and whether its source is local, each required (+1), excluded (-1) or
// not tested (0).
type originTest struct{ pod, local int8 }

// markRules returns the rules that mark for masquerade exactly the
// origins in mask (bit 1<<origin): one rule per test, any of which marks.
// Marking continues the chain, so the rules precede every action.
func markRules(f servicelb.Family, mask int, d pods) []*rule {
	has := func(o servicelb.Origin) bool { return mask&(1<<o) != 0 }
	o, p, n := has(servicelb.FromOutside), has(servicelb.FromPod), has(servicelb.FromNode)
	pods := d.detects()
	if !pods {
		p = o // no flow is a pod's: a pod's verdict is never seen
	}
	var tests []originTest
	switch {
	case o == p && p == n:
		if o {
			tests = []originTest{{}}
		}
	case o == n: // pods differ
		tests = []originTest{{pod: sign(p)}}
	case o == p: // the node differs
		if n {
			tests = []originTest{{pod: -1, local: 1}}
		} else {
			tests = []originTest{{pod: 1}, {local: -1}}
		}
	default: // outside differs
		if p {
			tests = []originTest{{pod: 1}, {local: 1}}
		} else {
			tests = []originTest{{pod: -1, local: -1}}
		}
	}
	var rs []*rule
	for _, t := range tests {
		if t.pod == 1 && !pods {
			continue // no flow is a pod's
		}
		var terms []term
		if t.pod != 0 && pods {
			terms = append(terms, d.match(f, t.pod < 0))
		}
		if t.local != 0 {
			terms = append(terms, fibLocal(t.local > 0))
		}
		rs = append(rs, mk(append(terms, jump(chainMarkMasq))...))
	}
	return slices.Clip(rs)
}

func sign(b bool) int8 {
	if b {
		return 1
	}
	return -1
}
