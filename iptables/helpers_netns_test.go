//go:build privileged || vm

package iptables

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var families = []servicelb.Family{servicelb.IPv4, servicelb.IPv6}

func saveCmd(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "ip6tables-nft-save"
	}
	return "iptables-nft-save"
}

func restoreCmd(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "ip6tables-nft-restore"
	}
	return "iptables-nft-restore"
}

// saved returns iptables-nft-save's text of one family, comment lines
// dropped and counters zeroed.
func saved(t *testing.T, h *netnstest.Host, f servicelb.Family) string {
	t.Helper()
	return xtables.StripSave(h.Exec(t, saveCmd(f)))
}

func newProxier(t testing.TB, h *netnstest.Host, o Options) *Proxier {
	t.Helper()
	o.NetNS = h.NS
	px, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return px
}

// nftRules returns the rules of every table as `nft --debug=netlink`
// shows their expressions, by "family table chain", handles and counter
// values left out.
func nftRules(t *testing.T, h *netnstest.Host) map[string][]string {
	t.Helper()
	out := h.Exec(t, "nft", "--debug=netlink", "list", "ruleset")
	header := regexp.MustCompile(`^(ip6?) (nat|filter) (\S+) \d+( \d+)?$`)
	counter := regexp.MustCompile(`counter pkts \d+ bytes \d+`)
	rules := map[string][]string{}
	var cur string
	var expr []string
	flush := func() {
		if cur != "" {
			rules[cur] = append(rules[cur], strings.Join(expr, "\n"))
		}
		cur, expr = "", nil
	}
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\n")
		if m := header.FindStringSubmatch(line); m != nil {
			flush()
			cur = m[1] + " " + m[2] + " " + m[3]
			continue
		}
		if cur != "" && strings.HasPrefix(line, "  [") {
			expr = append(expr, counter.ReplaceAllString(line, "counter"))
			continue
		}
		flush()
	}
	flush()
	return rules
}

// Ports the backends serve on.
const (
	tcpPort  = 8080
	udpPort  = 5353
	sctpPort = 3868
)

// env is a topology whose node runs a Proxier.
type env struct {
	t    *testing.T
	tp   *netnstest.Topology
	px   *Proxier
	node servicelb.NodeConfig
	fam  servicelb.Family
}

func newEnv(t *testing.T, fam servicelb.Family, protos ...string) *env {
	t.Helper()
	netnstest.Require(t, "nf_tables", "nft_compat", "nat", "veth")
	tp := netnstest.New(t, netnstest.Options{Backends: 3})
	for _, b := range tp.Backends {
		b.Serve(t, "tcp", tcpPort)
		for _, p := range protos {
			port := map[string]uint16{"udp": udpPort, "sctp": sctpPort}[p]
			b.Serve(t, p, port)
		}
	}
	e := &env{t: t, tp: tp, fam: fam, node: servicelb.NodeConfig{
		NodeName:     "node",
		NodeIPs:      tp.NodeIPs(),
		ClusterCIDRs: netnstest.ClusterCIDRs(),
	}}
	e.px = newProxier(t, tp.Node, Options{})
	return e
}

// pick returns the IPv4 or IPv6 form, for the env's family.
func (e *env) pick(v4, v6 string) netip.Addr {
	if e.fam == servicelb.IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

func (e *env) addr(h *netnstest.Host) netip.Addr {
	if e.fam == servicelb.IPv6 {
		return h.IPv6
	}
	return h.IPv4
}

func (e *env) gateway(h *netnstest.Host) netip.Addr {
	if e.fam == servicelb.IPv6 {
		return h.Gateway6
	}
	return h.Gateway4
}

func (e *env) nodeIP() netip.Addr { return e.addr(e.tp.Node) }

// endpoint is backend i, local to the node or not.
func (e *env) endpoint(i int, local bool) servicelb.Endpoint {
	n := "other-node"
	if local {
		n = "node"
	}
	return servicelb.Endpoint{Addr: e.addr(e.tp.Backends[i]), NodeName: n}
}

func (e *env) sync(svcs ...servicelb.Service) *servicelb.State {
	e.t.Helper()
	st, err := servicelb.NewState(e.node, svcs...)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := servicetest.SyncErr(e.px.Sync(context.Background(), st)); err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) ask(from *netnstest.Host, proto string, dst netip.Addr, port uint16, opts ...netnstest.AskOption) (netnstest.Reply, error) {
	return from.Ask(context.Background(), proto, netip.AddrPortFrom(dst, port), opts...)
}

// mustAsk asks and fails the test unless backend want answers.
func (e *env) mustAsk(from *netnstest.Host, proto string, dst netip.Addr, port uint16, opts ...netnstest.AskOption) netnstest.Reply {
	e.t.Helper()
	r, err := e.ask(from, proto, dst, port, opts...)
	if err != nil {
		e.t.Fatalf("%s %s from %s: %v", proto, netip.AddrPortFrom(dst, port), from.Name, err)
	}
	return r
}

func (e *env) wantErr(from *netnstest.Host, proto string, dst netip.Addr, port uint16, kind error) {
	e.t.Helper()
	r, err := e.ask(from, proto, dst, port)
	if !errors.Is(err, kind) {
		e.t.Errorf("%s %s from %s: got %+v, %v; want %v", proto, netip.AddrPortFrom(dst, port), from.Name, r, err, kind)
	}
}

func forFamilies(t *testing.T, f func(t *testing.T, fam servicelb.Family)) {
	for _, fam := range families {
		t.Run(fam.String(), func(t *testing.T) {
			t.Parallel()
			f(t, fam)
		})
	}
}

func checkRendered(t *testing.T, h *netnstest.Host, px *Proxier, st *servicelb.State, when string) {
	t.Helper()
	for _, f := range families {
		want, err := px.RenderFamily(st, f)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, saved(t, h, f)); diff != "" {
			t.Fatalf("%s: %s differs from Render (-render +saved):\n%s", when, saveCmd(f), diff)
		}
	}
}

// lines returns the sorted rule and chain lines of save text, without
// table headers and COMMIT lines.
func lines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.HasPrefix(l, "-A") || strings.HasPrefix(l, ":") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
