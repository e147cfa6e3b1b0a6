//go:build linux

package xtables

import "net/netip"

// Local is how the flows of a node's pods are recognised, for one family:
// by their source prefixes, or by the interface they come in on (the
// start of its name, with Prefix). It has the shape of
// servicelb.LocalMatch, which a backend converts to it, so that this
// package knows rules and not the model.
type Local struct {
	CIDRs     []netip.Prefix
	Interface string
	Prefix    bool
}

// The flows of a node's pods in rules: kube-proxy's IfLocal and IfNotLocal
// matches. A source prefix is -s CIDR, a bridge -i cbr0, an interface
// name prefix -i veth+. A locally generated flow has no input interface:
// -i never matches it and ! -i always does, in any chain.

// Pods returns r restricted to the pods' flows: one rule per source
// prefix, or one rule with the input interface; none when m recognises no
// flow. r's own source or input interface is replaced.
func Pods(m Local, r Rule) []Rule {
	if m.Interface != "" {
		r.In, r.NotIn = ifaceName(m), false
		return []Rule{r}
	}
	out := make([]Rule, 0, len(m.CIDRs))
	for _, c := range m.CIDRs {
		r.Src, r.NotSrc = c, false
		out = append(out, r)
	}
	return out
}

// NotPods returns r restricted to the flows that are not the pods', when
// one rule can say it: ! -i with an interface, ! -s with one source
// prefix. It reports false for several prefixes (a rule cannot be outside
// all of them: a chain of returns must) and when m recognises no flow.
func NotPods(m Local, r Rule) (Rule, bool) {
	switch {
	case m.Interface != "":
		r.In, r.NotIn = ifaceName(m), true
	case len(m.CIDRs) == 1:
		r.Src, r.NotSrc = m.CIDRs[0], true
	default:
		return r, false
	}
	return r, true
}

// ifaceName returns the interface as -i takes it: a name prefix ends in
// '+'.
func ifaceName(m Local) string {
	if m.Prefix {
		return m.Interface + "+"
	}
	return m.Interface
}
