//go:build linux

package conformance

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// explained is the explanation of a task's flow, with where it came from.
type explained struct {
	ex  servicelb.Explanation
	src netip.Addr
}

// explainer counts the flows explained per scenario and remembers the
// sessions used, so that an established flow is not taken for a new one.
type explainer struct {
	mu       sync.Mutex
	sessions map[string]bool
	checked  map[int]int // by scenario
}

// fresh reports whether the session flow named key is new, and marks it
// used.
func (x *explainer) fresh(key string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.sessions == nil {
		x.sessions = map[string]bool{}
	}
	used := x.sessions[key]
	x.sessions[key] = true
	return !used
}

func (x *explainer) count(scenario int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.checked == nil {
		x.checked = map[int]int{}
	}
	x.checked[scenario]++
}

func (x *explainer) checkedIn(scenario int) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.checked[scenario]
}

// explain returns the applied state's explanation of a new flow from
// asker a (the origin fr) to the frontend dst, or nil when the flow is
// not new: a session the scenario used before.
func (l *lab) explain(t *testing.T, e *Env, a asker, fr From, dst netip.AddrPort, p servicelb.Protocol, session uint16) *explained {
	t.Helper()
	if session != 0 && !l.explains.fresh(fmt.Sprintf("%d/%s/%s/%s/%d", e.idx, fr, dst, p, session)) {
		return nil
	}
	flow := servicelb.Flow{Protocol: p, Dst: dst}
	src := a.from
	switch {
	case a.h == l.tp.Node:
		// The node's own flow: the node tells it by the hook it passes,
		// not by its source, which is whatever address the kernel picks
		// (a load-balancer IP the node holds, for one).
		o := servicelb.FromNode
		flow.Origin = &o
		var err error
		if src, err = sourceOf(a.h, dst); err != nil {
			t.Fatalf("the node's source address towards %s: %v", dst, err)
		}
	default:
		flow.InInterface = a.h.NodeLink
		if a.h.NodeBridge != "" {
			flow.InInterface = a.h.NodeBridge
		}
		if !src.IsValid() {
			src = a.h.IPv4
			if dst.Addr().Is6() {
				src = a.h.IPv6
			}
		}
	}
	flow.Src = netip.AddrPortFrom(src, 0)
	l.explains.count(e.idx)
	return &explained{ex: e.state.Explain(flow), src: src}
}

// sourceOf returns the source address host h's kernel picks for a flow
// to dst: a route lookup, with no packet sent.
func sourceOf(h *netnstest.Host, dst netip.AddrPort) (netip.Addr, error) {
	var src netip.Addr
	err := h.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		src = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		return nil
	})
	return src, err
}

// hostOf returns the endpoint host that holds a, or -1.
func hostOf(a netip.Addr) int {
	for i := range Endpoints + 2 {
		if a == netnstest.BackendIPv4(i) || a == netnstest.BackendIPv6(i) {
			return i
		}
	}
	return -1
}

// hosts returns the endpoint hosts an explanation forwards to, sorted.
func (x *explained) hosts() []int {
	var out []int
	for _, b := range x.ex.Endpoints {
		out = append(out, hostOf(b.Addr))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// masquerades reports whether the explanation has a flow to endpoint
// host i masqueraded: by its verdict, or as a hairpin (an endpoint that
// reaches itself).
func (x *explained) masquerades(i int) bool {
	if x.ex.Verdict.Masquerade {
		return true
	}
	return x.ex.Port != nil && hostOf(x.src) == i && x.ex.Port.IsHairpin(x.src)
}

// disagreement says how the explanation differs from what check c
// wants, or "".
func (x *explained) disagreement(c Check) string {
	ex, w := &x.ex, c.Want
	if !ex.Handled {
		// The proxier leaves the flow to the node: its own stack refuses
		// what it does not serve, and what it routes on meets whatever
		// holds the address, here nothing; no endpoint answers.
		if w.kind != reach {
			return ""
		}
		return fmt.Sprintf("it explains the flow as left to the node, want %s", w.kindText())
	}
	switch a := ex.Verdict.Action; {
	case a == servicelb.Reject && w.kind != refused, a == servicelb.Drop && w.kind != dropped:
		return fmt.Sprintf("it explains the flow as %s, want %s", a, w.kindText())
	case a.Forwards() && w.kind != reach:
		return fmt.Sprintf("it explains the flow as forwarded (%s) to %s, want %s", ex.Verdict, hostList(x.hosts()), w.kindText())
	case !a.Forwards():
		return ""
	}
	want := slices.Sorted(slices.Values(w.backends))
	if got := x.hosts(); !slices.Equal(got, slices.Compact(want)) {
		return fmt.Sprintf("it names endpoints %s, want %s", hostList(got), hostList(want))
	}
	for _, i := range want {
		switch m := x.masquerades(i); {
		case w.source == masqueraded && !m:
			return fmt.Sprintf("it keeps the source towards %s, want it masqueraded", hostList([]int{i}))
		case w.source == preserved && m:
			return fmt.Sprintf("it masquerades the flow towards %s, want the source kept", hostList([]int{i}))
		}
	}
	if w.port != 0 {
		for _, b := range ex.Endpoints {
			if b.Port != w.port {
				return fmt.Sprintf("it names endpoint %s, want port %d", b, w.port)
			}
		}
	}
	if w.sticky && len(ex.Endpoints) > 1 && ex.Affinity == 0 {
		return "it names no client affinity, want one endpoint throughout"
	}
	if w.shares != nil {
		return x.sharesDisagree(w.shares)
	}
	return ""
}

// sharesDisagree compares the explanation's weights, summed per host,
// with the shares a check wants.
func (x *explained) sharesDisagree(shares map[int]float64) string {
	weights := map[int]float64{}
	var total, want float64
	for _, b := range x.ex.Endpoints {
		weights[hostOf(b.Addr)] += float64(b.Weight)
		total += float64(b.Weight)
	}
	for _, s := range shares {
		want += s
	}
	for i, s := range shares {
		if math.Abs(weights[i]/total-s/want) > 1e-9 {
			return fmt.Sprintf("it weighs the endpoints %v, want shares %v", weights, shares)
		}
	}
	return ""
}

// answerDisagrees says how an answer from endpoint host i, which saw the
// client as seen, differs from the explanation, or "". A backend
// without servicelb.FeaturePreserveSource shows the node as every client.
func (l *lab) answerDisagrees(x *explained, a asker, i int, seen netip.Addr) string {
	ex := &x.ex
	if !ex.Handled || !ex.Verdict.Action.Forwards() {
		if i >= 0 {
			return fmt.Sprintf("endpoint %s answered a flow it explains as %s", hostList([]int{i}), verdictText(ex))
		}
		return ""
	}
	if !slices.Contains(x.hosts(), i) {
		return fmt.Sprintf("it names endpoints %s, not the one that answered", hostList(x.hosts()))
	}
	source := preserved
	if x.masquerades(i) || !l.caps.Features.Has(servicelb.FeaturePreserveSource) {
		source = masqueraded
	}
	if msg := l.sourceMismatch(a, source, i, seen); msg != "" {
		return fmt.Sprintf("it says the source is %s: %s", map[sourceRule]string{masqueraded: "masqueraded", preserved: "kept"}[source], msg)
	}
	return ""
}

func verdictText(ex *servicelb.Explanation) string {
	if !ex.Handled {
		return "left to the node"
	}
	return ex.Verdict.String()
}

// kindText names what an outcome wants.
func (o Outcome) kindText() string {
	switch o.kind {
	case refused:
		return "refused"
	case dropped:
		return "dropped"
	}
	return "an answer from " + hostList(o.backends)
}

// explainFailure formats a disagreement with the explanation's text.
func explainFailure(what, msg string, x *explained) string {
	return fmt.Sprintf("%s: the explanation disagrees: %s\n%s", what, msg, indent(x.ex.Text()))
}

func indent(s string) string {
	return "\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t")
}

// checkKernel asks a proxier that gives the kernel's word
// (servicelb.FlowChecker) what serves the flow x explains: it must find
// no difference.
func (l *lab) checkKernel(t *testing.T, x *explained, what string) {
	t.Helper()
	fc, ok := l.p.(servicelb.FlowChecker)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc, err := fc.CheckFlow(ctx, &x.ex)
	switch {
	case err != nil:
		t.Errorf("%s: the kernel's word on the flow: %v", what, err)
	case !kc.Agrees():
		t.Errorf("%s: the kernel (%s) differs from the explanation:\n%s\nit read:\n%s\nthe explanation:\n%s", what, kc.Backend,
			indent(strings.Join(kc.Differences, "\n")), indent(strings.Join(kc.Read, "\n")), indent(x.ex.Text()))
	}
}
