//go:build vm

package ipvs

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// vmFeatures are the kernel features every vm test of the package needs.
var vmFeatures = []string{"ip_vs", "dummy", "veth", "netns"}

// env is a topology with a proxier programming its node.
type env struct {
	t    *testing.T
	tp   *netnstest.Topology
	p    *Proxier
	opts Options
	node servicelb.NodeConfig
	// foreign are the lines of ipvsadm -Sn of virtual servers someone
	// else made, which comparisons with Render leave aside.
	foreign string
}

// newEnv builds a topology with n backends and a proxier for its node.
func newEnv(t *testing.T, n int, o Options) *env {
	t.Helper()
	netnstest.Require(t, vmFeatures...)
	tp := netnstest.New(t, netnstest.Options{Backends: n})
	o.NetNS = tp.Node.NS
	e := &env{t: t, tp: tp, opts: o, node: servicelb.NodeConfig{
		NodeName: "node", NodeIPs: tp.NodeIPs(), ClusterCIDRs: netnstest.ClusterCIDRs(),
	}}
	e.p = e.newProxier()
	return e
}

func (e *env) newProxier() *Proxier {
	e.t.Helper()
	p, err := New(e.opts)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() { p.Close() })
	return p
}

func (e *env) state(svcs ...servicelb.Service) *servicelb.State {
	e.t.Helper()
	return mustState(e.t, e.node, svcs...)
}

// sync syncs st and fails the test on error.
func (e *env) sync(st *servicelb.State) {
	e.t.Helper()
	if err := servicetest.SyncErr(e.p.Sync(e.t.Context(), st)); err != nil {
		e.t.Fatalf("Sync: %v", err)
	}
}

// backendAddr returns backend i's address of family f.
func backendAddr(i int, f servicelb.Family) netip.Addr {
	if f == servicelb.IPv6 {
		return netnstest.BackendIPv6(i)
	}
	return netnstest.BackendIPv4(i)
}

// endpoints returns ready endpoints on the given backends, in both
// families, on node "node".
func endpoints(backends ...int) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, i := range backends {
		for _, f := range []servicelb.Family{servicelb.IPv4, servicelb.IPv6} {
			out = append(out, servicelb.Endpoint{Addr: backendAddr(i, f), NodeName: "node"})
		}
	}
	return out
}

// serve starts echo servers for proto on port on the given backends.
func (e *env) serve(proto string, port uint16, backends ...int) {
	e.t.Helper()
	for _, i := range backends {
		e.tp.Backends[i].Serve(e.t, proto, port)
	}
}

// section returns the lines of one section of Render's text.
func section(text, header string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(line, "# ") {
			in = strings.HasPrefix(line, header)
			continue
		}
		if in {
			b.WriteString(line)
		}
	}
	return b.String()
}

// checkIPVS compares `ipvsadm -Sn` in the node with Render's IPVS section.
func (e *env) checkIPVS(st *servicelb.State) {
	e.t.Helper()
	want, err := Render(st, e.p.opts)
	if err != nil {
		e.t.Fatalf("Render: %v", err)
	}
	got := e.tp.Node.Exec(e.t, "ipvsadm", "-Sn")
	if diff := cmp.Diff(section(want, SectionIPVS), got); diff != "" {
		e.t.Errorf("ipvsadm -Sn differs from Render (-want +got):\n%s", diff)
	}
}

// writes returns how many changes the proxier has sent to the kernel.
func (e *env) writes() int {
	e.p.mu.Lock()
	defer e.p.mu.Unlock()
	return e.p.writes()
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// session is a long-lived TCP connection from the client to a backend's
// line echo server (see serveLines).
type session struct {
	c net.Conn
	r *bufio.Reader
}

// serveLines starts, on backend i, a TCP server on port that answers each
// line with the backend's name on the same connection, until the test ends.
func (e *env) serveLines(i int, port uint16) {
	e.t.Helper()
	h := e.tp.Backends[i]
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		e.t.Fatalf("listen on %s: %v", h.Name, err)
	}
	e.t.Cleanup(func() { ln.Close() })
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", h.Name)
		}
	})
}

// dial opens a session from the client to dst.
func (e *env) dial(dst netip.AddrPort) *session {
	e.t.Helper()
	var c net.Conn
	err := e.tp.Client.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), 2*time.Second)
		return err
	})
	if err != nil {
		e.t.Fatalf("dial %s: %v", dst, err)
	}
	e.t.Cleanup(func() { c.Close() })
	return &session{c: c, r: bufio.NewReader(c)}
}

// ask sends a line and returns the answering host, or an error.
func (s *session) ask() (string, error) {
	s.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(s.c, "ask\n"); err != nil {
		return "", err
	}
	line, err := s.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// mustAsk fails the test unless the session answers from host.
func (s *session) mustAsk(t *testing.T, host string) {
	t.Helper()
	got, err := s.ask()
	if err != nil || got != host {
		t.Fatalf("session ask: %q, %v; want %q", got, err, host)
	}
}

// closeAbort closes the session with a reset, so that IPVS forgets the
// connection within seconds (CLOSE state) instead of minutes (TIME_WAIT).
func (s *session) closeAbort() {
	if tc, ok := s.c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	s.c.Close()
}

// eventually retries f until it returns nil or d passes.
func eventually(t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mapsValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// parseSave parses `ipvsadm -Sn` text.
func parseSave(t *testing.T, text string) []*VirtualServer {
	t.Helper()
	var out []*VirtualServer
	byName := map[string]*VirtualServer{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		name := f[1] + " " + f[2]
		switch f[0] {
		case "-A":
			vs := &VirtualServer{Scheduler: f[4]}
			vs.Protocol = map[string]servicelb.Protocol{"-t": tcp, "-u": udp, "--sctp-service": sctp}[f[1]]
			addr := netip.MustParseAddrPort(f[2])
			vs.Addr, vs.Port = addr.Addr(), addr.Port()
			if len(f) >= 7 && f[5] == "-p" {
				var n uint32
				fmt.Sscan(f[6], &n)
				vs.Persistence = n
			}
			byName[name] = vs
			out = append(out, vs)
		case "-a":
			r := netip.MustParseAddrPort(f[4])
			var w uint16
			fmt.Sscan(f[7], &w)
			byName[name].Real = append(byName[name].Real, RealServer{Addr: r.Addr(), Port: r.Port(), Weight: w})
		}
	}
	return out
}

// syncLeavingOut syncs st, which the proxier must apply except the
// services it leaves out with an error of kind, and checks that the
// kernel then holds exactly the rest, as Render renders it. It returns the
// names left out, sorted, and the rest.
func (e *env) syncLeavingOut(st *servicelb.State, kind error) ([]string, *servicelb.State) {
	e.t.Helper()
	rep, err := e.p.Sync(e.t.Context(), st)
	names := leftOut(e.t, rep, err, kind)
	rest := rep.Applied
	got := kernelText(e.t, e.tp.Node, e.p.opts)
	got[SectionIPVS] = dropLines(got[SectionIPVS], e.foreign)
	if diff := cmp.Diff(renderText(e.t, rest, e.p.opts), got); diff != "" {
		e.t.Fatalf("after leaving out %v, the kernel differs from Render of the rest (-render +kernel):\n%s", names, diff)
	}
	return names, rest
}

// leftOut checks that a Sync succeeded leaving out services with errors
// of kind, and returns their names, sorted.
func leftOut(t testing.TB, rep servicelb.SyncReport, err error, kind error) []string {
	t.Helper()
	if err != nil || len(rep.LeftOut) == 0 || !errors.Is(servicetest.LeftOut(rep), kind) {
		t.Fatalf("Sync: %v, left out %v, want services left out with %v", err, rep.LeftOut, kind)
	}
	return slices.Sorted(maps.Keys(rep.LeftOut))
}

// dropLines returns text without the lines of drop.
func dropLines(text, drop string) string {
	gone := map[string]bool{}
	for l := range strings.Lines(drop) {
		gone[l] = true
	}
	var b strings.Builder
	for l := range strings.Lines(text) {
		if !gone[l] {
			b.WriteString(l)
		}
	}
	return b.String()
}
