//go:build vm

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// longService is a TCP service on port 7000 (line servers) and 80 (echo
// servers), with the given backends.
func longService(backends ...int) servicelb.Service {
	return servicelb.Service{
		Name: "default/long", ClusterIPs: []netip.Addr{a("10.96.0.40"), a("fd00:96::40")},
		Ports: []servicelb.Port{
			{Name: "lines", Protocol: tcp, Port: 7000, NodePort: 30700},
			{Name: "echo", Protocol: tcp, Port: 80, TargetPort: 8080},
			{Name: "dns", Protocol: udp, Port: 53, TargetPort: 5353},
		},
		Endpoints: endpoints(backends...),
	}
}

// backendIndex returns the index of the backend named host.
func (e *env) backendIndex(host string) int {
	e.t.Helper()
	i := slices.IndexFunc(e.tp.Backends, func(h *netnstest.Host) bool { return h.Name == host })
	if i < 0 {
		e.t.Fatalf("no backend %q", host)
	}
	return i
}

// TestGracefulTermination checks that a removed TCP real server keeps its
// open connection (at weight 0, taking no new one) and is deleted once the
// connection ends.
func TestGracefulTermination(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serveLines(0, 7000)
	e.serveLines(1, 7000)
	e.sync(e.state(longService(0, 1)))
	dst := ap(a("10.96.0.40"), 7000)
	s := e.dial(dst)
	x, err := s.ask()
	if err != nil {
		t.Fatal(err)
	}
	xi := e.backendIndex(x)
	st := e.state(longService(1 - xi))
	e.sync(st)
	drained := "-r " + netip.AddrPortFrom(backendAddr(xi, servicelb.IPv4), 7000).String() + " -m -w 0"
	if out := e.tp.Node.Exec(t, "ipvsadm", "-Sn"); !strings.Contains(out, drained) {
		t.Fatalf("ipvsadm -Sn lacks %q:\n%s", drained, out)
	}
	s.mustAsk(t, x)
	y := e.tp.Backends[1-xi].Name
	for range 4 {
		n := e.dial(dst)
		n.mustAsk(t, y)
		n.closeAbort()
	}
	s.mustAsk(t, x)
	if n, err := e.p.Drain(t.Context()); err != nil || n != 1 {
		t.Fatalf("Drain with the connection open: %d draining, %v; want 1", n, err)
	}
	s.closeAbort()
	eventually(t, 40*time.Second, func() error {
		n, err := e.p.Drain(t.Context())
		if err == nil && n != 0 {
			err = errors.New("real server still draining")
		}
		return err
	})
	e.checkIPVS(st)
}

// TestGracefulTimeout checks that a draining real server is deleted after
// the graceful timeout even with a connection open, which then fails.
func TestGracefulTimeout(t *testing.T) {
	e := newEnv(t, 2, Options{GracefulTimeout: time.Second})
	e.serveLines(0, 7000)
	e.serveLines(1, 7000)
	e.sync(e.state(longService(0, 1)))
	s := e.dial(ap(a("fd00:96::40"), 7000))
	x, err := s.ask()
	if err != nil {
		t.Fatal(err)
	}
	st := e.state(longService(1 - e.backendIndex(x)))
	e.sync(st)
	s.mustAsk(t, x)
	time.Sleep(1200 * time.Millisecond)
	if n, err := e.p.Drain(t.Context()); err != nil || n != 0 {
		t.Fatalf("Drain after the timeout: %d draining, %v; want 0", n, err)
	}
	e.checkIPVS(st)
	if got, err := s.ask(); err == nil {
		t.Fatalf("connection to a deleted real server answered %q", got)
	}
}

// flowRecorder is a FlowCleaner that records what it is asked to delete.
type flowRecorder struct {
	mu    sync.Mutex
	flows []servicelb.StaleFlow
}

func (r *flowRecorder) DeleteStale(_ context.Context, flows []servicelb.StaleFlow) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.flows = append(r.flows, flows...)
	return 0, nil
}

// TestUDPRemovedAtOnce checks that removed UDP real servers go at once, and
// that the frontends they served are handed to the FlowCleaner with the
// endpoints still serving (servicelb's stale flows of the change).
func TestUDPRemovedAtOnce(t *testing.T) {
	rec := &flowRecorder{}
	e := newEnv(t, 2, Options{Conntrack: rec})
	e.serve("udp", 5353, 0, 1)
	e.sync(e.state(longService(0, 1)))
	dst := ap(a("10.96.0.40"), 53)
	if counts := e.tp.Client.Count(t, "udp", dst, 4); len(counts) != 2 {
		t.Fatalf("answers %v: want both backends", counts)
	}
	rec.flows = nil
	st := e.state(longService(1))
	e.sync(st)
	e.checkIPVS(st)
	want := []servicelb.StaleFlow{
		{Protocol: udp, Dst: a("10.96.0.40"), Port: 53, Serving: []netip.AddrPort{ap(backendAddr(1, servicelb.IPv4), 5353)}},
		{Protocol: udp, Dst: a("fd00:96::40"), Port: 53, Serving: []netip.AddrPort{ap(backendAddr(1, servicelb.IPv6), 5353)}},
	}
	if diff := cmp.Diff(want, rec.flows, cmp.Comparer(func(x, y netip.Addr) bool { return x == y }),
		cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y })); diff != "" {
		t.Errorf("stale flows (-want +got):\n%s", diff)
	}
	if counts := e.tp.Client.Count(t, "udp", dst, 4); counts["backend-1"] != 4 {
		t.Fatalf("answers %v: want backend-1 only", counts)
	}
}

// TestUDPServingEndpointKeepsItsFlows checks that a UDP session keeps its
// endpoint while the endpoint serves, though no longer chosen (terminating
// while another is ready, drained, or left out by a Local policy): its real
// server drains at weight 0 while new flows go elsewhere; once the endpoint
// serves no more, the real server goes at once and the session moves.
func TestUDPServingEndpointKeepsItsFlows(t *testing.T) {
	netnstest.Require(t, "conntrack")
	e := newEnv(t, 2, Options{})
	e.serve("udp", 5353, 0, 1)
	svc := func(eps ...servicelb.Endpoint) servicelb.Service {
		s := longService()
		s.Endpoints = eps
		return s
	}
	dst, session := ap(a("10.96.0.40"), 53), netnstest.FromPort(40053)
	ep0, ep1 := endpoints(0), endpoints(1)
	terminating, drained, other := slices.Clone(ep0), slices.Clone(ep0), slices.Clone(ep0)
	for i := range ep0 {
		terminating[i].Ready, terminating[i].Serving, terminating[i].Terminating = new(false), new(true), true
		drained[i].Weight = servicelb.Weight(0)
		other[i].NodeName = "other"
	}
	local := svc(slices.Concat(other, ep1)...)
	local.InternalTrafficPolicy = servicelb.PolicyLocal
	// A session moved off a deleted real server may lose a datagram to
	// IPVS expiring its connection.
	sessionReaches := func(what, host string) {
		t.Helper()
		eventually(t, 5*time.Second, func() error {
			r, err := e.tp.Client.Ask(t.Context(), "udp", dst, session)
			if err == nil && r.Host != host {
				err = fmt.Errorf("%s: session answered by %s, want %s", what, r.Host, host)
			}
			return err
		})
	}
	for _, stage := range []struct {
		name string
		svc  servicelb.Service
	}{
		{"terminating", svc(slices.Concat(terminating, ep1)...)},
		{"drained", svc(slices.Concat(drained, ep1)...)},
		{"left out by the Local policy", local},
	} {
		e.sync(e.state(svc(ep0...)))
		sessionReaches(stage.name, "backend-0")
		e.sync(e.state(stage.svc))
		if r := askFrom(t, e.tp.Client, "udp", dst, session); r.Host != "backend-0" {
			t.Errorf("%s: session answered by %s, want backend-0 still", stage.name, r.Host)
		}
		if counts := e.tp.Client.Count(t, "udp", dst, 3); counts["backend-1"] != 3 {
			t.Errorf("%s: new flows answered by %v, want backend-1", stage.name, counts)
		}
		drained := "-r " + netip.AddrPortFrom(backendAddr(0, servicelb.IPv4), 5353).String() + " -m -w 0"
		if out := e.tp.Node.Exec(t, "ipvsadm", "-Sn"); !strings.Contains(out, drained) {
			t.Errorf("%s: ipvsadm -Sn lacks %q:\n%s", stage.name, drained, out)
		}
		st := e.state(svc(ep1...))
		e.sync(st)
		sessionReaches(stage.name+", backend-0 serving no more", "backend-1")
		e.checkIPVS(st)
	}
}

// TestNoConntrackCleanup checks that NoConntrackCleanup leaves the flows
// of removed UDP real servers alone, whatever Conntrack is.
func TestNoConntrackCleanup(t *testing.T) {
	rec := &flowRecorder{}
	e := newEnv(t, 2, Options{Conntrack: rec, NoConntrackCleanup: true})
	e.sync(e.state(longService(0, 1)))
	st := e.state(longService(1))
	e.sync(st)
	e.checkIPVS(st)
	if len(rec.flows) != 0 {
		t.Errorf("stale flows handed over: %v", rec.flows)
	}
}

// TestRestartKeepsConnections checks that a new Proxier adopts what an old
// one left without sending a change, while an open connection and a stream
// of new ones go on.
func TestRestartKeepsConnections(t *testing.T) {
	e := newEnv(t, 2, Options{})
	e.serveLines(0, 7000)
	e.serveLines(1, 7000)
	e.serve("tcp", 8080, 0, 1)
	e.serve("udp", 5353, 0, 1)
	st := e.state(longService(0, 1))
	e.sync(st)
	s := e.dial(ap(a("10.96.0.40"), 7000))
	x, err := s.ask()
	if err != nil {
		t.Fatal(err)
	}
	asks := netnstest.Repeat(t, func() error {
		_, errTCP := e.tp.Client.Ask(context.Background(), "tcp", ap(a("10.96.0.40"), 80))
		_, errUDP := e.tp.Client.Ask(context.Background(), "udp", ap(a("fd00:96::40"), 53))
		return errors.Join(errTCP, errUDP)
	})
	e.p.Close()
	e.p = e.newProxier()
	before := e.writes()
	e.sync(st)
	if n := e.writes() - before; n != 0 {
		t.Errorf("the restarted proxier sent %d changes for an unchanged state, want 0", n)
	}
	s.mustAsk(t, x)
	time.Sleep(500 * time.Millisecond)
	for _, err := range asks.Stop() {
		t.Errorf("ask during the restart: %v", err)
	}
	t.Logf("%d rounds of asks during the restart", asks.Runs())
	e.checkIPVS(st)
}

// TestRefusedServicesLeftOut checks that the services the proxier cannot
// apply (a scheduler it does not have, more ports needing firewall marks
// than its mask holds) are left out and the rest applied, on a fresh
// proxier and on one that applied a state before; that the service that
// holds the last mark keeps it against a newcomer; and that a service
// left out comes in once it is fixed.
func TestRefusedServicesLeftOut(t *testing.T) {
	e := newEnv(t, 2, Options{FWMarkMask: 0x10000})
	random := longService(0, 1)
	random.Name, random.ClusterIPs = "default/random", []netip.Addr{a("10.96.0.42")}
	random.Ports = slices.Clone(random.Ports)
	random.Ports[0].NodePort = 30702
	random.Scheduler = servicelb.SchedulerRandom
	// Each needs a mark per family for its node port under the Local
	// policy; the mask holds one.
	local := longService(0, 1)
	local.ExternalTrafficPolicy = servicelb.PolicyLocal
	local2 := local
	local2.Name, local2.ClusterIPs = "default/long2", []netip.Addr{a("10.96.0.41")}
	local2.Ports = slices.Clone(local.Ports)
	local2.Ports[0].NodePort = 30701

	names, _ := e.syncLeavingOut(e.state(random), servicelb.ErrUnsupported)
	require.Equal(t, []string{"default/random"}, names, "first Sync")
	names, _ = e.syncLeavingOut(e.state(random, local, local2), servicelb.ErrCapacity)
	require.Len(t, names, 2, "a sync with two services that need marks and one unsupported")
	require.Contains(t, names, "default/random")

	e.sync(e.state(local))
	names, _ = e.syncLeavingOut(e.state(local, local2), servicelb.ErrCapacity)
	require.Equal(t, []string{"default/long2"}, names, "the service that holds the mark keeps it")
	names, _ = e.syncLeavingOut(e.state(local, local2, random), servicelb.ErrUnsupported)
	require.Equal(t, []string{"default/long2", "default/random"}, names, "a service left out stays out while unchanged")

	random.Scheduler = servicelb.SchedulerRoundRobin
	names, _ = e.syncLeavingOut(e.state(local, local2, random), servicelb.ErrCapacity)
	require.Equal(t, []string{"default/long2"}, names, "a fixed service comes in")
	st := e.state(local, random)
	e.sync(st)
	e.checkIPVS(st)
}

// TestOwnership checks that the proxier touches only its own virtual
// servers: foreign ones on node addresses and on other addresses survive
// Sync, a restart and Cleanup, as do those of a second proxier with its
// own link and sets; a State needing a foreign virtual server is refused.
func TestOwnership(t *testing.T) {
	e := newEnv(t, 1, Options{})
	for _, args := range [][]string{
		{"-A", "-t", "198.51.100.1:9999", "-s", "rr"},
		{"-A", "-t", "198.51.100.1:30081", "-s", "rr"},
		{"-A", "-u", "10.250.0.1:53", "-s", "wlc"},
	} {
		e.tp.Node.Exec(t, "ipvsadm", args...)
	}
	foreign := e.tp.Node.Exec(t, "ipvsadm", "-Sn")
	e.foreign = foreign
	st := e.state(longService(0))
	clash := longService(0)
	clash.Ports[0].NodePort = 30081
	clash.Name, clash.ClusterIPs = "default/clash", []netip.Addr{a("10.96.0.43")}
	for _, sync := range []struct {
		name string
		st   *servicelb.State
	}{
		{"first Sync", e.state(longService(0), clash)},
		{"Sync of a change", e.state(longService(0), clash)},
	} {
		if sync.name != "first Sync" {
			e.sync(st)
		}
		names, _ := e.syncLeavingOut(sync.st, ErrConflict)
		require.Equal(t, []string{"default/clash"}, names, sync.name)
		require.ErrorIs(t, servicetest.SyncErr(e.p.Sync(t.Context(), sync.st)), servicelb.ErrFrontendTaken)
	}
	e.node.MasqueradeAll = true // a node change: a sync of every port
	names, _ := e.syncLeavingOut(e.state(longService(0), clash), ErrConflict)
	require.Equal(t, []string{"default/clash"}, names, "Sync of a new node")
	e.node.MasqueradeAll = false
	e.sync(st)

	o2 := Options{NetNS: e.tp.Node.NS, Interface: "kproxy-ipvs1", SetPrefix: "kp2-", ChainPrefix: "KP2-"}
	p2, err := New(o2)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	other := servicelb.Service{Name: "other/web", ClusterIPs: []netip.Addr{a("10.96.7.7")},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30777}}, Endpoints: endpoints(0)}
	st2 := e.state(other)
	if err := servicetest.SyncErr(p2.Sync(t.Context(), st2)); err != nil {
		t.Fatal(err)
	}
	render := func(st *servicelb.State) []*VirtualServer {
		p, err := buildModel(st, &e.p.opts)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Collect(mapsValues(p.servers))
	}
	ours, theirs := render(st), render(st2)
	foreignVS := parseSave(t, foreign)
	check := func(what string, sets ...[]*VirtualServer) {
		t.Helper()
		want := RenderVirtualServers(slices.Concat(sets...))
		if got := e.tp.Node.Exec(t, "ipvsadm", "-Sn"); got != want {
			t.Fatalf("%s: ipvsadm -Sn (-want +got):\n%s", what, cmp.Diff(want, got))
		}
	}
	check("both synced", foreignVS, ours, theirs)
	e.p.Close()
	e.p = e.newProxier()
	e.sync(st)
	check("after a restart", foreignVS, ours, theirs)
	if err := e.p.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("after Cleanup", foreignVS, theirs)
	if out, err := e.tp.Node.Output(t.Context(), "", "ip", "link", "show", "kproxy-ipvs0"); err == nil {
		t.Errorf("dummy link left after Cleanup:\n%s", out)
	}
	if out := e.tp.Node.Exec(t, "ipset", "list", "-n"); strings.Contains(out, DefaultSetPrefix) {
		t.Errorf("sets left after Cleanup:\n%s", out)
	}
	if err := p2.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("after both Cleanups", foreignVS)
	if out := e.tp.Node.Exec(t, "ipset", "list", "-n"); strings.TrimSpace(out) != "" {
		t.Errorf("sets left after both Cleanups:\n%s", out)
	}
}

// TestUDPConntrackCleanup checks, with the real conntrack table, that
// removing a UDP real server deletes the conntrack flows that went to it,
// and that the client's next datagram from the same port reaches another
// backend.
func TestUDPConntrackCleanup(t *testing.T) {
	netnstest.Require(t, "conntrack")
	e := newEnv(t, 2, Options{})
	e.serve("udp", 5353, 0, 1)
	e.sync(e.state(longService(0, 1)))
	dst := ap(a("10.96.0.40"), 53)
	from := netnstest.FromPort(40053)
	counts := e.tp.Client.Count(t, "udp", dst, 3, from)
	if len(counts) != 1 {
		t.Fatalf("answers %v from one source port: want one backend", counts)
	}
	var x string
	for h := range counts {
		x = h
	}
	xi := e.backendIndex(x)
	flows := func() string {
		return e.tp.Node.Exec(t, "conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.0.40")
	}
	reply := "src=" + backendAddr(xi, servicelb.IPv4).String() + " "
	if out := flows(); !strings.Contains(out, reply) {
		t.Fatalf("conntrack -L lacks a flow answered by %s:\n%s\nall flows:\n%s", x, out, e.tp.Node.Exec(t, "conntrack", "-L"))
	}
	e.sync(e.state(longService(1 - xi)))
	if out := flows(); strings.Contains(out, reply) {
		t.Fatalf("a flow to the removed %s is left:\n%s", x, out)
	}
	y := e.tp.Backends[1-xi].Name
	eventually(t, 5*time.Second, func() error {
		r, err := e.tp.Client.Ask(t.Context(), "udp", dst, from)
		if err == nil && r.Host != y {
			err = errors.New("answered by " + r.Host)
		}
		return err
	})
}

// TestChangeCostsItsSize checks that a sync sends only the change: nothing
// for the same state, and for one endpoint replaced among a hundred
// services, one real server added and one deleted, and the hairpin entries
// of both endpoints.
func TestChangeCostsItsSize(t *testing.T) {
	e := newEnv(t, 1, Options{})
	svcs := make([]servicelb.Service, 100)
	for i := range svcs {
		svcs[i] = benchService(i, 0)
	}
	st := e.state(svcs...)
	e.sync(st)
	before := e.writes()
	e.sync(st)
	e.sync(e.state(svcs...)) // equal, but another State
	if n := e.writes() - before; n != 0 {
		t.Errorf("syncs of an unchanged state sent %d changes, want 0", n)
	}
	svcs[42].Endpoints[3].Addr = a("100.127.255.1")
	next := e.state(svcs...)
	before = e.writes()
	e.sync(next)
	if n := e.writes() - before; n != 4 {
		t.Errorf("one endpoint replaced: %d changes, want 4", n)
	}
	e.checkIPVS(next)
}

// TestPreexistingLinkKept: a dummy link of the Interface's name that
// someone else made holds the virtual addresses as well; Cleanup removes
// them and leaves the link, where a link the proxier made goes.
func TestPreexistingLinkKept(t *testing.T) {
	netnstest.Require(t, vmFeatures...)
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Node.Exec(t, "ip", "link", "add", DefaultInterface, "type", "dummy")
	e := &env{t: t, tp: tp, opts: Options{NetNS: tp.Node.NS}, node: servicelb.NodeConfig{
		NodeName: "node", NodeIPs: tp.NodeIPs(), ClusterCIDRs: netnstest.ClusterCIDRs(),
	}}
	e.p = e.newProxier()
	e.sync(e.state(benchService(1, 0)))
	if out := tp.Node.Exec(t, "ip", "address", "show", "dev", DefaultInterface); !strings.Contains(out, "/32") {
		t.Fatalf("no virtual address on the link:\n%s", out)
	}
	if err := e.p.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	out, err := tp.Node.Output(t.Context(), "", "ip", "address", "show", "dev", DefaultInterface)
	if err != nil {
		t.Fatalf("the link someone else made is gone after Cleanup: %v", err)
	}
	if strings.Contains(out, "inet ") {
		t.Errorf("virtual addresses left on the link after Cleanup:\n%s", out)
	}
}
