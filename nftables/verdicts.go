package nftables

import (
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// A port's entry chain renders the verdicts of one kind of frontend. A
// chain tells origins apart as servicelb does: a pod by a source in the
// cluster CIDRs of the family (set cluster-cidrs4/6), else the node by a
// local source ("fib saddr type local"), else outside. It first marks for
// masquerade the traffic of the origins whose verdict masquerades, then
// sends each origin to its action: the origins whose action differs from
// outside's first (pods, then the node), and outside's as the
// fall-through.

// entryRules renders verdicts vs in a chain of family f; pods says
// whether the family has cluster CIDRs (without them no source is a pod).
// lbs are the port's balancers by action.
func (p *planner) entryRules(f servicelb.Family, vs servicelb.Verdicts, pods bool, lbs map[servicelb.Action]balancer) []*rule {
	mask := 0
	for o, v := range vs {
		if v.Masquerade {
			mask |= 1 << o
		}
	}
	marks := p.marks[famIndex(f)][boolByte(pods)][mask]
	rs := make([]*rule, 0, len(marks)+origins+1)
	rs = append(rs, marks...)
	for _, o := range routes(vs, pods) {
		a := vs[o].Action
		switch {
		case a.Forwards():
			rs = append(rs, lbs[a].rule(originTerms(f, o)...))
		case a == servicelb.Reject:
			rs = append(rs, p.ends[famIndex(f)][o][1])
		default:
			rs = append(rs, p.ends[famIndex(f)][o][0])
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
// and the node when their action differs from outside's, and outside, the
// fall-through, last. Pods are also tested when the node is and their
// actions differ, since a pod's source may be a local address (a node's
// address in the cluster CIDRs).
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
// order of routes: a pod by its source, the node by a local source, and
// outside by nothing (it is what remains).
func originTerms(f servicelb.Family, o servicelb.Origin) []term {
	switch o {
	case servicelb.FromPod:
		return []term{inSet(f, true, false, fixedSet(kindClusterCIDRs, f).name())}
	case servicelb.FromNode:
		return []term{fibLocal(true)}
	}
	return nil
}

// contextFamily is the family that the terms matching origin o name, as
// nft sees it when it encodes a reject after them; 0 for none.
func contextFamily(f servicelb.Family, o servicelb.Origin) servicelb.Family {
	if o == servicelb.FromPod {
		return f
	}
	return 0
}

// originTest is a condition on a packet's origin: whether its source is
// in the cluster CIDRs (pod) and whether it is local, each required (+1),
// excluded (-1) or not tested (0).
type originTest struct{ pod, local int8 }

// markRules returns the rules that mark for masquerade exactly the
// origins in mask (bit 1<<origin): one rule per test, any of which marks.
// Marking continues the chain, so the rules precede every action.
func markRules(f servicelb.Family, mask int, pods bool) []*rule {
	has := func(o servicelb.Origin) bool { return mask&(1<<o) != 0 }
	o, p, n := has(servicelb.FromOutside), has(servicelb.FromPod), has(servicelb.FromNode)
	if !pods {
		p = o // no source is a pod: a pod's verdict is never seen
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
			continue // no source is a pod
		}
		var terms []term
		if t.pod != 0 && pods {
			terms = append(terms, inSet(f, true, t.pod < 0, fixedSet(kindClusterCIDRs, f).name()))
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
