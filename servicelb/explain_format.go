package servicelb

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"text/tabwriter"
)

// Text returns the explanation as an operator reads it: one field a line
// (flow, origin, frontend, verdict, why, masquerade, source ranges,
// affinity, endpoints, excluded, conflicts), the reasons in the proxy's
// words.
func (e *Explanation) Text() string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 12, 0, 2, ' ', 0)
	line := func(field, format string, args ...any) {
		fmt.Fprintf(w, "%s\t"+format+"\n", append([]any{field}, args...)...)
	}
	lines := func(field string, items []string) {
		if len(items) == 0 {
			line(field, "none")
		}
		for i, it := range items {
			if i > 0 {
				field = ""
			}
			line(field, "%s", it)
		}
	}
	f := e.Flow
	src := f.Src.String()
	if f.Src.Port() == 0 {
		src = f.Src.Addr().String()
	}
	line("flow", "%s %s -> %s", strings.ToLower(string(f.Protocol)), src, f.Dst)
	line("origin", "%s: %s", e.Origin, e.OriginWhy)
	if e.Port != nil {
		line("frontend", "%s of %s", e.Frontend, e.Port.Key)
	} else {
		line("frontend", "none")
	}
	line("verdict", "%s", e.verdictText())
	lines("why", e.Why)
	if e.MasqueradeWhy != "" {
		line("masquerade", "%s", e.MasqueradeWhy)
	}
	if len(e.SourceRanges) > 0 {
		line("sources", "%v (%s)", e.SourceRanges, map[bool]string{true: "allowed", false: "not allowed"}[e.SourceAllowed])
	}
	if e.Port != nil {
		if e.Affinity > 0 {
			line("affinity", "client IP, %s", e.Affinity)
		} else {
			line("affinity", "none")
		}
	}
	var eps []string
	for _, b := range e.Endpoints {
		eps = append(eps, fmt.Sprintf("%s  weight %d%s%s", b.AddrPort(), b.Weight,
			map[bool]string{true: "  local"}[b.Local], map[bool]string{false: "  terminating"}[b.Ready]))
	}
	if e.Verdict.Action.Forwards() {
		lines("endpoints", eps)
	}
	var xs []string
	for _, x := range e.Excluded {
		node := ""
		if x.NodeName != "" {
			node = " on " + x.NodeName
		}
		xs = append(xs, fmt.Sprintf("%s%s: %s", x.Endpoint, node, x.Why))
	}
	if e.Port != nil {
		lines("excluded", xs)
	}
	var cs []string
	for _, c := range e.Conflicts {
		cs = append(cs, c.String())
	}
	if len(cs) > 0 {
		lines("conflicts", cs)
	}
	w.Flush()
	return b.String()
}

// verdictText says what happens to the flow, in words.
func (e *Explanation) verdictText() string {
	if !e.Handled {
		return "not the proxy's: the node routes it as any other flow"
	}
	masq := ", source kept"
	if e.Verdict.Masquerade {
		masq = ", masqueraded"
	}
	switch e.Verdict.Action {
	case ToCluster:
		return "forwarded to one of the endpoints below (the cluster's)" + masq
	case ToLocal:
		return "forwarded to one of the endpoints below (this node's)" + masq
	case Drop:
		return "dropped: the client hears nothing"
	}
	return "rejected: the client gets a port unreachable (a TCP client, a refused connection)"
}

// explanationJSON is the --json form of an Explanation; ExplanationSchema
// documents it.
type explanationJSON struct {
	Flow          flowJSON       `json:"flow"`
	Origin        string         `json:"origin"`
	OriginWhy     string         `json:"originWhy"`
	Handled       bool           `json:"handled"`
	ServicePort   string         `json:"servicePort,omitempty"`
	Frontend      *frontendJSON  `json:"frontend,omitempty"`
	Action        string         `json:"action"`
	Masquerade    bool           `json:"masquerade"`
	Why           []string       `json:"why"`
	MasqueradeWhy string         `json:"masqueradeWhy,omitempty"`
	SourceRanges  []netip.Prefix `json:"sourceRanges,omitempty"`
	SourceAllowed bool           `json:"sourceAllowed"`
	AffinitySecs  int64          `json:"affinitySeconds,omitempty"`
	Endpoints     []endpointJSON `json:"endpoints"`
	Excluded      []excludedJSON `json:"excluded"`
	Conflicts     []conflictJSON `json:"conflicts"`
}

type flowJSON struct {
	Protocol    Protocol       `json:"protocol"`
	Src         netip.AddrPort `json:"src"`
	Dst         netip.AddrPort `json:"dst"`
	InInterface string         `json:"inInterface,omitempty"`
}

type frontendJSON struct {
	Kind string     `json:"kind"`
	Addr netip.Addr `json:"addr"`
	Port uint16     `json:"port"`
}

type endpointJSON struct {
	Endpoint netip.AddrPort `json:"endpoint"`
	Weight   uint16         `json:"weight"`
	Local    bool           `json:"local"`
	Ready    bool           `json:"ready"`
}

type excludedJSON struct {
	Endpoint netip.AddrPort `json:"endpoint"`
	NodeName string         `json:"nodeName,omitempty"`
	Why      string         `json:"why"`
}

type conflictJSON struct {
	Frontend string   `json:"frontend"`
	Winner   string   `json:"winner"`
	Losers   []string `json:"losers"`
}

// Text returns the kernel's word as Explanation.Text lays it out, to
// follow it: whether it agrees, each difference, and what was read.
func (k KernelCheck) Text() string {
	var b strings.Builder
	verdict := "agrees with the explanation"
	switch n := len(k.Differences); {
	case n == 1:
		verdict = "DIFFERS from the explanation in 1 place"
	case n > 1:
		verdict = fmt.Sprintf("DIFFERS from the explanation in %d places", n)
	}
	fmt.Fprintf(&b, "%-12s%s %s\n", "kernel", k.Backend, verdict)
	for i, d := range k.Differences {
		fmt.Fprintf(&b, "%-12s%s\n", map[bool]string{true: "differs"}[i == 0], d)
	}
	for i, r := range k.Read {
		fmt.Fprintf(&b, "%-12s%s\n", map[bool]string{true: "read"}[i == 0], r)
	}
	return b.String()
}

// ExplanationSchema documents the JSON form of an Explanation
// (MarshalJSON), field by field. "kernel" is only in a running proxy's
// answer: its backend's reading of the kernel for the flow (KernelCheck),
// when the backend gives it (FlowChecker).
const ExplanationSchema = `{
  "flow":            {"protocol": "TCP|UDP|SCTP", "src": "addr:port", "dst": "addr:port", "inInterface": "name, when given"},
  "origin":          "outside|pod|node",
  "originWhy":       "how the origin was told, or \"given\"",
  "handled":         "false: no frontend, the proxy leaves the flow alone",
  "servicePort":     "service:port/family of the frontend hit, when one is",
  "frontend":        {"kind": "cluster IP|node port|external IP|load-balancer IP", "addr": "address", "port": 80},
  "action":          "cluster|local|drop|reject: forwarded to the cluster's or this node's endpoints, dropped, rejected",
  "masquerade":      "whether the source is rewritten to the node's",
  "why":             ["the reasons of the action, in order"],
  "masqueradeWhy":   "why the flow is masqueraded or keeps its source, when forwarded",
  "sourceRanges":    ["prefixes a load-balancer IP admits, when it has any"],
  "sourceAllowed":   "whether the flow's source is among them",
  "affinitySeconds": "client IP affinity timeout; absent without affinity",
  "endpoints":       [{"endpoint": "addr:port", "weight": 1, "local": true, "ready": true}],
  "excluded":        [{"endpoint": "addr:port (port 0: serves no such port)", "nodeName": "node", "why": "reason"}],
  "conflicts":       [{"frontend": "what is claimed", "winner": "service served there", "losers": ["services not served there"]}],
  "kernel":          {"backend": "name", "read": ["what the backend read back that serves the flow"], "differences": ["where it differs; none: it agrees"]}
}`

// MarshalJSON encodes the explanation as ExplanationSchema documents.
func (e *Explanation) MarshalJSON() ([]byte, error) {
	j := explanationJSON{
		Flow:          flowJSON{Protocol: e.Flow.Protocol, Src: e.Flow.Src, Dst: e.Flow.Dst, InInterface: e.Flow.InInterface},
		Origin:        e.Origin.String(),
		OriginWhy:     e.OriginWhy,
		Handled:       e.Handled,
		Action:        e.Verdict.Action.String(),
		Masquerade:    e.Verdict.Masquerade,
		Why:           e.Why,
		MasqueradeWhy: e.MasqueradeWhy,
		SourceRanges:  e.SourceRanges,
		SourceAllowed: e.SourceAllowed,
		AffinitySecs:  int64(e.Affinity.Seconds()),
		Endpoints:     []endpointJSON{},
		Excluded:      []excludedJSON{},
		Conflicts:     []conflictJSON{},
	}
	if e.Port != nil {
		j.ServicePort = e.Port.Key.String()
		j.Frontend = &frontendJSON{Kind: e.Frontend.Kind.String(), Addr: e.Frontend.Addr, Port: e.Frontend.Port}
	}
	for _, b := range e.Endpoints {
		j.Endpoints = append(j.Endpoints, endpointJSON{Endpoint: b.AddrPort(), Weight: b.Weight, Local: b.Local, Ready: b.Ready})
	}
	for _, x := range e.Excluded {
		j.Excluded = append(j.Excluded, excludedJSON(x))
	}
	for _, c := range e.Conflicts {
		j.Conflicts = append(j.Conflicts, conflictJSON(c))
	}
	return json.Marshal(j)
}
