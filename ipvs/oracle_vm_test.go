//go:build vm

package ipvs

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// saveTables splits iptables-save text into its tables, comment lines and
// counters removed.
func saveTables(text string) map[string]string {
	out := map[string]string{}
	var name string
	for line := range strings.Lines(xtables.StripSave(text)) {
		if strings.HasPrefix(line, "*") {
			name = strings.TrimSpace(line[1:])
		}
		out[name] += line
	}
	return out
}

// setLines returns ipset save's text reduced to what Render shows: create
// lines up to the family, and entries, sorted.
func setLines(text string) []string {
	var out []string
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && f[0] == "create":
			out = append(out, strings.Join(f[:5], " "))
		case len(f) >= 3 && f[0] == "add":
			out = append(out, strings.Join(f, " "))
		}
	}
	slices.Sort(out)
	return out
}

// kernelText returns the kernel state of host h in Render's sections, as
// the tools print it.
func kernelText(t *testing.T, h *netnstest.Host, o Options) map[string]string {
	t.Helper()
	out := map[string]string{SectionIPVS: h.Exec(t, "ipvsadm", "-Sn"), SectionAddresses: ""}
	var addrs []netip.Prefix
	if text, err := h.Output(t.Context(), "", "ip", "-o", "addr", "show", "dev", o.Interface); err == nil {
		for line := range strings.Lines(text) {
			if f := strings.Fields(line); len(f) > 3 {
				addrs = append(addrs, netip.MustParsePrefix(f[3]))
			}
		}
	}
	slices.SortFunc(addrs, func(x, y netip.Prefix) int { return cmp.Compare(x.Addr().Compare(y.Addr()), 0) })
	for _, p := range addrs {
		out[SectionAddresses] += p.String() + "\n"
	}
	out[SectionSets] = strings.Join(setLines(h.Exec(t, "ipset", "save")), "\n")
	for sec, tool := range map[string]string{SectionRules4: "iptables-nft-save", SectionRules6: "ip6tables-nft-save"} {
		for name, text := range saveTables(h.Exec(t, tool)) {
			out[sec+" "+name] = text
		}
	}
	return out
}

// renderText returns Render's text for st in the same shape as kernelText.
func renderText(t *testing.T, st *servicelb.State, o Options) map[string]string {
	t.Helper()
	text, err := Render(st, o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{
		SectionIPVS:      section(text, SectionIPVS),
		SectionAddresses: section(text, SectionAddresses),
		SectionSets:      strings.Join(setLines(section(text, SectionSets)), "\n"),
	}
	for _, sec := range []string{SectionRules4, SectionRules6} {
		for name, tt := range saveTables(section(text, sec)) {
			out[sec+" "+name] = tt
		}
	}
	return out
}

// TestKernelEqualsRender syncs a rich state and checks that every tool's
// view of the kernel is what Render shows.
func TestKernelEqualsRender(t *testing.T) {
	e := newEnv(t, 3, Options{})
	sticky := multiService()
	sticky.Name, sticky.Scheduler = "default/sticky", servicelb.SchedulerMaglev
	sticky.ClusterIPs = []netip.Addr{a("10.96.0.11"), a("fd00:96::11")}
	sticky.Affinity = servicelb.SessionAffinity{ClientIP: true}
	for i := range sticky.Ports {
		sticky.Ports[i].NodePort += 100
	}
	lb := localService(servicelb.PolicyLocal, servicelb.PolicyCluster, true)
	lb.SourceRanges = []netip.Prefix{pfx("203.0.113.0/24"), pfx("2001:db8:1::/48")}
	empty := servicelb.Service{Name: "default/empty", ClusterIPs: []netip.Addr{a("10.96.0.12")},
		Ports: []servicelb.Port{{Protocol: udp, Port: 53}}}
	st := e.state(multiService(), sticky, lb, empty)
	e.sync(st)
	want, got := renderText(t, st, e.p.opts), kernelText(t, e.tp.Node, e.p.opts)
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("kernel differs from Render (-render +kernel):\n%s", diff)
	}
	// Each other local-traffic detection, one after the other: a node
	// change that rewrites the rules that recognise pods.
	for _, d := range []servicelb.DetectLocal{
		{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("10.244.9.0/24")}},
		{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"},
		{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
	} {
		e.node.DetectLocal = d
		st := e.state(multiService(), sticky, lb, empty)
		e.sync(st)
		want, got := renderText(t, st, e.p.opts), kernelText(t, e.tp.Node, e.p.opts)
		if diff := gocmp.Diff(want, got); diff != "" {
			t.Errorf("%s: kernel differs from Render (-render +kernel):\n%s", d.Mode, diff)
		}
	}
}

// walk is a random walk of states through one proxier.
type walk struct {
	t   *testing.T
	g   *servicetest.Gen
	b   *servicelb.Builder
	h   *netnstest.Host
	o   Options
	p   *Proxier
	cur *servicelb.State
	// want is cur without the services the proxier left out.
	want *servicelb.State

	applied, leftOut, restarts int
}

// next returns the state after a random change: a service added, changed
// or removed, or the node changed (see servicetest.Gen.Step).
func (w *walk) next() (*servicelb.State, bool) {
	if _, err := w.g.Step(w.b); err != nil {
		w.t.Fatal(err)
	}
	st := w.b.State()
	return st, st != w.cur
}

// step syncs one random successor, sometimes after a restart. When the
// proxier leaves services out, the kernel must hold the rest, exactly as
// Render renders it (checked on some steps and on every 25th).
func (w *walk) step(i int) {
	t := w.t
	next, ok := w.next()
	if !ok {
		return
	}
	if w.g.IntN(20) == 0 {
		// A restart: a new Proxier adopts what the old one left.
		w.p.Close()
		w.p = w.newProxier()
		w.restarts++
	}
	rep, err := w.p.Sync(t.Context(), next)
	if err != nil {
		t.Fatalf("step %d: Sync: %v", i, err)
	}
	w.cur, w.want = next, rep.Applied
	if out := servicetest.LeftOut(rep); out != nil {
		if !errors.Is(out, servicelb.ErrUnsupported) && !errors.Is(out, servicelb.ErrCapacity) {
			t.Fatalf("step %d: Sync left out %v", i, out)
		}
		w.leftOut++
	} else {
		w.applied++
	}
	if i%50 == 49 || (len(rep.LeftOut) > 0 && i%5 == 0) {
		if diff := gocmp.Diff(renderText(t, w.want, w.o), kernelText(t, w.h, w.o)); diff != "" {
			t.Fatalf("step %d: kernel differs from Render (-render +kernel):\n%s", i, diff)
		}
	}
}

func (w *walk) newProxier() *Proxier {
	p, err := New(w.o)
	if err != nil {
		w.t.Fatal(err)
	}
	return p
}

// TestRandomTransitions walks 300 random state transitions (services added,
// changed and removed, the node changed, some services refused, now and
// then a restart of the proxier) and checks that the kernel then equals a
// fresh apply of the final state, and that a sync that left services out
// applied the rest.
func TestRandomTransitions(t *testing.T) {
	netnstest.Require(t, vmFeatures...)
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	g := randomStates(seed)
	b, err := servicelb.NewBuilder(g.Node())
	if err != nil {
		t.Fatal(err)
	}
	w := &walk{t: t, g: g, b: b, h: netnstest.NewHost(t, "walk")}
	w.o = Options{NetNS: w.h.NS}
	w.p = w.newProxier()
	defer func() { w.p.Close() }()
	w.o = w.p.opts
	w.cur = b.State()
	w.want = w.cur
	for i := range 300 {
		w.step(i)
	}
	t.Logf("%d states applied whole, %d with services left out, %d restarts; %d services at the end, %d applied",
		w.applied, w.leftOut, w.restarts, w.cur.Len(), w.want.Len())
	fresh := netnstest.NewHost(t, "fresh")
	p2, err := New(Options{NetNS: fresh.NS})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	// A fresh proxier may leave out others than the walk's, which kept
	// the services that came first: apply what the walk applied.
	if err := servicetest.SyncErr(p2.Sync(t.Context(), w.want)); err != nil {
		t.Fatal(err)
	}
	walked := kernelText(t, w.h, w.o)
	if diff := gocmp.Diff(kernelText(t, fresh, p2.opts), walked); diff != "" {
		t.Fatalf("after the walk the kernel differs from a fresh apply (-fresh +walked):\n%s", diff)
	}
	if diff := gocmp.Diff(renderText(t, w.want, w.o), walked); diff != "" {
		t.Fatalf("after the walk the kernel differs from Render (-render +walked):\n%s", diff)
	}
}

// TestRepairsForeignDamage removes parts of the proxier's kernel state
// behind its back (a virtual server, a real server's weight, an address, a
// set's entries, a jump) and checks that the next Sync of the same state
// restores all of it.
func TestRepairsForeignDamage(t *testing.T) {
	// A deep check on every sync: what no cheap check sees (a virtual
	// server or one of its real servers deleted, a real server's weight
	// changed, a set flushed) is repaired by the next one.
	e := newEnv(t, 2, Options{VerifyInterval: time.Nanosecond})
	e.serve("tcp", 8080, 0, 1)
	multi := multiService()
	multi.Endpoints = endpoints(0, 1)
	st := e.state(multi, localService(servicelb.PolicyLocal, servicelb.PolicyCluster, true))
	e.sync(st)
	want := renderText(t, st, e.p.opts)
	for _, damage := range [][]string{
		{"ipvsadm", "-D", "-t", "10.96.0.10:80"},
		{"ipvsadm", "-d", "-t", "10.96.0.10:80", "-r", ap(backendAddr(1, servicelb.IPv4), 8080).String()},
		{"ipvsadm", "-e", "-t", "10.96.0.10:80", "-r", ap(backendAddr(0, servicelb.IPv4), 8080).String(), "-m", "-w", "5"},
		{"ip", "addr", "del", "10.96.0.50/32", "dev", DefaultInterface},
		{"ipset", "flush", DefaultSetPrefix + "loop-back-4"},
		{"ipvsadm", "-E", "-t", "[fd00:96::50]:80", "-s", "wlc"},
		{"iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "kproxy-ipvs service portals", "-j", "KPROXY-IPVS-SERVICES"},
	} {
		e.tp.Node.Exec(t, damage[0], damage[1:]...)
		if got := kernelText(t, e.tp.Node, e.p.opts); gocmp.Equal(want, got) {
			t.Fatalf("%v changed nothing", damage)
		}
		e.sync(st)
		if diff := gocmp.Diff(want, kernelText(t, e.tp.Node, e.p.opts)); diff != "" {
			t.Fatalf("after %v and a Sync, the kernel differs from Render (-render +kernel):\n%s", damage, diff)
		}
	}
	if counts := e.tp.Client.Count(t, "tcp", ap(a("10.96.0.10"), 80), 4); len(counts) != 2 {
		t.Errorf("answers %v after the repairs, want both backends", counts)
	}
}
