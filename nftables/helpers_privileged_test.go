//go:build privileged || vm

package nftables_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newProxier returns a Proxier for h's namespace, closed at the end of the
// test.
func newProxier(t testing.TB, h *netnstest.Host, o nftables.Options) *nftables.Proxier {
	t.Helper()
	o.NetNS = h.NS
	p, err := nftables.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func mustState(t testing.TB, node servicelb.NodeConfig, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(node, svcs...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustSync(t testing.TB, p *nftables.Proxier, st *servicelb.State) {
	t.Helper()
	if err := servicetest.SyncErr(p.Sync(testCtx(t), st)); err != nil {
		t.Fatal(err)
	}
}

// generation reads the ruleset generation of h's namespace.
func generation(t testing.TB, h *netnstest.Host) uint32 {
	t.Helper()
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := c.Generation(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

// Addresses of the services the tests define.
var (
	clusterIP4 = netip.MustParseAddr("10.96.0.10")
	clusterIP6 = netip.MustParseAddr("fd00:96::10")
	lbIP4      = netip.MustParseAddr("203.0.113.10")
	externalIP = netip.MustParseAddr("203.0.113.20")
)

// richState exercises every feature of the table: both families, TCP, UDP
// and SCTP, node ports, external and load-balancer addresses with source
// ranges, Local policies, affinity, weights, a port without endpoints.
func richState(t testing.TB) *servicelb.State {
	node := servicelb.NodeConfig{
		NodeName:     "node",
		NodeIPs:      []netip.Addr{netnstest.NodeIPv4(), netnstest.NodeIPv6()},
		ClusterCIDRs: netnstest.ClusterCIDRs(),
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")},
	}
	ep := func(i int, v6 bool, nodeName string) servicelb.Endpoint {
		a := netnstest.BackendIPv4(i)
		if v6 {
			a = netnstest.BackendIPv6(i)
		}
		return servicelb.Endpoint{Addr: a, NodeName: nodeName}
	}
	return mustState(t, node,
		servicelb.Service{
			Name: "default/web", ClusterIPs: []netip.Addr{clusterIP4, clusterIP6},
			ExternalIPs: []netip.Addr{externalIP}, LoadBalancerIPs: []netip.Addr{lbIP4},
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/28")},
			Ports: []servicelb.Port{
				{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080, TargetPort: 8080},
				{Name: "dns", Protocol: servicelb.UDP, Port: 53, NodePort: 30053, TargetPort: 8080},
				{Name: "sig", Protocol: servicelb.SCTP, Port: 38412, TargetPort: 8080},
			},
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			Endpoints:             []servicelb.Endpoint{ep(0, false, "node"), ep(1, false, "other"), ep(0, true, "node"), ep(2, true, "")},
		},
		servicelb.Service{
			Name: "default/sticky", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
			Ports:    []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Affinity: servicelb.SessionAffinity{ClientIP: true, Timeout: 90 * time.Second},
			Endpoints: []servicelb.Endpoint{
				{Addr: netnstest.BackendIPv4(0), Weight: servicelb.Weight(2)},
				{Addr: netnstest.BackendIPv4(1)},
			},
		},
		servicelb.Service{
			Name: "kube-system/empty", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.12")},
			Ports: []servicelb.Port{{Name: "p", Protocol: servicelb.UDP, Port: 99}},
		},
		servicelb.Service{
			Name: "odd.name_1-x/y//z", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.14")},
			Ports:     []servicelb.Port{{Name: "a.b_c-9", Protocol: servicelb.UDP, Port: 9}},
			Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(2)}},
		},
		servicelb.Service{
			Name: "default/local", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.13")},
			InternalTrafficPolicy: servicelb.PolicyLocal,
			Ports:                 []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{
				{Addr: netnstest.BackendIPv4(0), NodeName: "node", Weight: servicelb.Weight(3)},
				{Addr: netnstest.BackendIPv4(1), NodeName: "node"},
				{Addr: netnstest.BackendIPv4(2), NodeName: "other"},
			},
		},
	)
}

// testLogger writes a proxier's log to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}
