//go:build privileged || vm

package nftables_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

const backendPort = 8080

// lab is a topology whose backends serve TCP and UDP on backendPort, with
// a proxier programming the node.
type lab struct {
	tp   *netnstest.Topology
	p    *nftables.Proxier
	node servicelb.NodeConfig
}

func newLab(t *testing.T, backends int, o nftables.Options) *lab {
	t.Helper()
	netnstest.Require(t, "nf_tables", "nat", "conntrack")
	tp := netnstest.New(t, netnstest.Options{Backends: backends})
	for _, b := range tp.Backends {
		b.Serve(t, "tcp", backendPort)
		b.Serve(t, "udp", backendPort)
	}
	return &lab{
		tp: tp,
		p:  newProxier(t, tp.Node, o),
		node: servicelb.NodeConfig{
			NodeName:     "node",
			NodeIPs:      tp.NodeIPs(),
			ClusterCIDRs: netnstest.ClusterCIDRs(),
		},
	}
}

func (l *lab) sync(t *testing.T, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st := mustState(t, l.node, svcs...)
	mustSync(t, l.p, st)
	return st
}

// endpoints returns endpoints for the given backends, IPv4 and IPv6, on
// the given node.
func endpoints(nodeName string, backends ...int) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, i := range backends {
		out = append(out,
			servicelb.Endpoint{Addr: netnstest.BackendIPv4(i), NodeName: nodeName},
			servicelb.Endpoint{Addr: netnstest.BackendIPv6(i), NodeName: nodeName})
	}
	return out
}

func webService(eps ...servicelb.Endpoint) servicelb.Service {
	return servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{clusterIP4, clusterIP6},
		Ports: []servicelb.Port{
			{Name: "tcp", Protocol: servicelb.TCP, Port: 80, NodePort: 30080, TargetPort: backendPort},
			{Name: "udp", Protocol: servicelb.UDP, Port: 80, NodePort: 30080, TargetPort: backendPort},
		},
		Endpoints: eps,
	}
}

func hostNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("backend-%d", i)
	}
	return out
}

func ask(t *testing.T, h *netnstest.Host, proto string, dst netip.AddrPort, opts ...netnstest.AskOption) (netnstest.Reply, error) {
	t.Helper()
	return h.Ask(testCtx(t), proto, dst, opts...)
}

func mustAsk(t *testing.T, h *netnstest.Host, proto string, dst netip.AddrPort, opts ...netnstest.AskOption) netnstest.Reply {
	t.Helper()
	r, err := ask(t, h, proto, dst, opts...)
	if err != nil {
		t.Fatalf("%s %s: %v", proto, dst, err)
	}
	return r
}

// TestDistribution: new flows spread evenly over the endpoints, through
// the cluster IP and the node port, over TCP and UDP, IPv4 and IPv6.
func TestDistribution(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	l.sync(t, webService(endpoints("", 0, 1, 2)...))
	const n = 300
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(clusterIP4, 80), netip.AddrPortFrom(clusterIP6, 80),
		netip.AddrPortFrom(netnstest.NodeIPv4(), 30080), netip.AddrPortFrom(netnstest.NodeIPv6(), 30080),
	} {
		for _, proto := range []string{"tcp", "udp"} {
			counts := l.tp.Client.Count(t, proto, dst, n)
			if err := netnstest.WithinBounds(counts, netnstest.EvenShares(hostNames(3)...), n); err != nil {
				t.Errorf("%s %s: %v", proto, dst, err)
			}
		}
	}
}

// TestWeights: flows spread in proportion to the endpoint weights.
func TestWeights(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	eps := endpoints("", 0, 1, 2)
	for i := range eps {
		eps[i].Weight = servicelb.Weight(uint16(1 + i/2))
	}
	l.sync(t, webService(eps...))
	const n = 600
	shares := netnstest.WeightedShares(map[string]float64{"backend-0": 1, "backend-1": 2, "backend-2": 3})
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 80), netip.AddrPortFrom(clusterIP6, 80)} {
		counts := l.tp.Client.Count(t, "tcp", dst, n)
		if err := netnstest.WithinBounds(counts, shares, n); err != nil {
			t.Errorf("%s: %v", dst, err)
		}
	}
}

// TestAffinity: a client sticks to one endpoint while it keeps connecting
// within the timeout, each client on its own; the pin expires after the
// timeout, so that later connections spread again.
func TestAffinity(t *testing.T) {
	const backends = 6
	l := newLab(t, backends, nftables.Options{})
	svc := webService(endpoints("", 0, 1, 2, 3, 4, 5)...)
	svc.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Second}
	l.sync(t, svc)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 80), netip.AddrPortFrom(clusterIP6, 80)} {
		for _, proto := range []string{"tcp", "udp"} {
			counts := l.tp.Client.Count(t, proto, dst, 30)
			if len(counts) != 1 {
				t.Errorf("%s %s: one client reached %v, want one endpoint", proto, dst, counts)
			}
		}
	}
	// Other clients get pins of their own: 8 clients all on one endpoint
	// out of 6 would happen with probability 6^-7.
	seen := map[string]bool{}
	for i := range 8 {
		a := netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)})
		l.tp.Client.AddAddress(t, netip.PrefixFrom(a, 24))
		counts := l.tp.Client.Count(t, "tcp", netip.AddrPortFrom(clusterIP4, 80), 5, netnstest.FromAddr(a))
		if len(counts) != 1 {
			t.Errorf("client %s reached %v, want one endpoint", a, counts)
		}
		for h := range counts {
			seen[h] = true
		}
	}
	if len(seen) < 2 {
		t.Errorf("8 clients all pinned to %v", seen)
	}
	// Expiry: after each wait beyond the timeout the client is free again.
	// Nine draws from six endpoints all equal with probability 6^-8.
	dst := netip.AddrPortFrom(clusterIP4, 80)
	seen = map[string]bool{}
	for range 9 {
		time.Sleep(1200 * time.Millisecond)
		seen[mustAsk(t, l.tp.Client, "tcp", dst).Host] = true
	}
	if len(seen) < 2 {
		t.Errorf("after the affinity timeout the client still always reaches %v", seen)
	}
}

// TestAffinitySetFull: once the affinity set is full, new clients still
// reach an endpoint; they only go unpinned. Pinned clients keep their pins.
func TestAffinitySetFull(t *testing.T) {
	l := newLab(t, 3, nftables.Options{AffinitySize: 2})
	svc := webService(endpoints("", 0, 1, 2)...)
	svc.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Minute}
	l.sync(t, svc)
	dst := netip.AddrPortFrom(clusterIP4, 80)
	first := map[netip.Addr]string{}
	for i := range 6 {
		a := netip.AddrFrom4([4]byte{198, 51, 100, byte(40 + i)})
		l.tp.Client.AddAddress(t, netip.PrefixFrom(a, 24))
		first[a] = mustAsk(t, l.tp.Client, "tcp", dst, netnstest.FromAddr(a)).Host
	}
	for i := range 2 {
		a := netip.AddrFrom4([4]byte{198, 51, 100, byte(40 + i)})
		if h := mustAsk(t, l.tp.Client, "tcp", dst, netnstest.FromAddr(a)).Host; h != first[a] {
			t.Errorf("pinned client %s moved from %s to %s", a, first[a], h)
		}
	}
}

// TestExternalTrafficPolicy: Local keeps the client's address and uses
// local endpoints only, dropping traffic on a node without them (while
// pods and the node itself still reach the cluster-wide endpoints);
// Cluster masquerades.
func TestExternalTrafficPolicy(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	local := webService(append(endpoints("node", 0), endpoints("other", 1)...)...)
	local.ExternalTrafficPolicy = servicelb.PolicyLocal
	l.sync(t, local)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(netnstest.NodeIPv4(), 30080), netip.AddrPortFrom(netnstest.NodeIPv6(), 30080)} {
		for _, proto := range []string{"tcp", "udp"} {
			for range 20 {
				r := mustAsk(t, l.tp.Client, proto, dst)
				client := l.tp.Client.IPv4
				if dst.Addr().Is6() {
					client = l.tp.Client.IPv6
				}
				if r.Host != "backend-0" || r.Client.Addr() != client {
					t.Fatalf("Local %s %s: answer %+v, want backend-0 seeing the client %s", proto, dst, r, client)
				}
			}
		}
	}

	remote := webService(endpoints("other", 1)...)
	remote.ExternalTrafficPolicy = servicelb.PolicyLocal
	l.sync(t, remote)
	nodePort := netip.AddrPortFrom(netnstest.NodeIPv4(), 30080)
	if _, err := ask(t, l.tp.Client, "tcp", nodePort); !errors.Is(err, netnstest.ErrTimeout) {
		t.Errorf("Local without local endpoints: %v, want a drop (timeout)", err)
	}
	if r := mustAsk(t, l.tp.Client, "tcp", netip.AddrPortFrom(clusterIP4, 80)); r.Host != "backend-1" {
		t.Errorf("cluster IP under internal Cluster policy answered by %s", r.Host)
	}
	// A pod reaching the node port takes the cluster-wide endpoints.
	if r := mustAsk(t, l.tp.Backends[2], "tcp", nodePort); r.Host != "backend-1" {
		t.Errorf("pod to a Local node port without local endpoints: answered by %s, want backend-1", r.Host)
	}

	l.sync(t, webService(endpoints("", 0)...))
	r := mustAsk(t, l.tp.Client, "tcp", nodePort)
	if want := l.tp.Backends[0].Gateway4; r.Client.Addr() != want {
		t.Errorf("Cluster policy: backend saw %s, want the node's %s (masqueraded)", r.Client.Addr(), want)
	}
}

// TestInternalTrafficPolicy: Local sends cluster IP traffic to local
// endpoints only, and drops it without them.
func TestInternalTrafficPolicy(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	svc := webService(append(endpoints("node", 0), endpoints("other", 1, 2)...)...)
	svc.InternalTrafficPolicy = servicelb.PolicyLocal
	l.sync(t, svc)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 80), netip.AddrPortFrom(clusterIP6, 80)} {
		counts := l.tp.Client.Count(t, "tcp", dst, 30)
		if counts["backend-0"] != 30 {
			t.Errorf("%s: %v, want every flow on the local backend-0", dst, counts)
		}
	}
	svc.Endpoints = endpoints("other", 1, 2)
	l.sync(t, svc)
	if _, err := ask(t, l.tp.Client, "tcp", netip.AddrPortFrom(clusterIP4, 80)); !errors.Is(err, netnstest.ErrTimeout) {
		t.Errorf("internal Local without local endpoints: %v, want a drop (timeout)", err)
	}
}

// TestMasquerade: traffic to a cluster IP from outside the cluster CIDRs is
// masqueraded, from a pod it keeps its source, and with MasqueradeAll
// everything is masqueraded.
func TestMasquerade(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	svc := webService(endpoints("", 0)...)
	l.sync(t, svc)
	gw := l.tp.Backends[0]
	for _, tc := range []struct {
		name     string
		from     *netnstest.Host
		dst      netip.Addr
		wantAddr netip.Addr
	}{
		{"client v4", l.tp.Client, clusterIP4, gw.Gateway4},
		{"client v6", l.tp.Client, clusterIP6, gw.Gateway6},
		{"pod v4", l.tp.Backends[1], clusterIP4, netnstest.BackendIPv4(1)},
		{"pod v6", l.tp.Backends[1], clusterIP6, netnstest.BackendIPv6(1)},
	} {
		r := mustAsk(t, tc.from, "tcp", netip.AddrPortFrom(tc.dst, 80))
		if r.Client.Addr() != tc.wantAddr {
			t.Errorf("%s: backend saw %s, want %s", tc.name, r.Client.Addr(), tc.wantAddr)
		}
	}
	l.node.MasqueradeAll = true
	l.sync(t, svc)
	if r := mustAsk(t, l.tp.Backends[1], "tcp", netip.AddrPortFrom(clusterIP4, 80)); r.Client.Addr() != gw.Gateway4 {
		t.Errorf("MasqueradeAll: pod's flow arrived from %s, want %s", r.Client.Addr(), gw.Gateway4)
	}
}

// TestHairpin: an endpoint reaching its own service reaches itself, from
// the node's address.
func TestHairpin(t *testing.T) {
	l := newLab(t, 2, nftables.Options{})
	l.sync(t, webService(endpoints("node", 0)...))
	b := l.tp.Backends[0]
	for _, tc := range []struct {
		dst, want netip.Addr
	}{{clusterIP4, b.Gateway4}, {clusterIP6, b.Gateway6}} {
		for _, proto := range []string{"tcp", "udp"} {
			r := mustAsk(t, b, proto, netip.AddrPortFrom(tc.dst, 80))
			if r.Host != "backend-0" || r.Client.Addr() != tc.want {
				t.Errorf("hairpin %s %s: %+v, want backend-0 seeing %s", proto, tc.dst, r, tc.want)
			}
		}
	}
}

// TestSourceRanges: a load-balancer IP admits its source ranges and
// drops everyone else, the node included when its addresses are outside
// the ranges.
func TestSourceRanges(t *testing.T) {
	l := newLab(t, 2, nftables.Options{})
	// The node sends to load-balancer addresses through the client link.
	l.tp.Node.Exec(t, "ip", "route", "add", "203.0.113.0/24", "dev", netnstest.ClientLink)
	allowed := webService(endpoints("", 0)...)
	allowed.LoadBalancerIPs = []netip.Addr{lbIP4}
	allowed.SourceRanges = []netip.Prefix{netip.PrefixFrom(l.tp.Client.IPv4, 32)}
	denied := webService(endpoints("", 1)...)
	denied.Name, denied.ClusterIPs = "default/denied", []netip.Addr{netip.MustParseAddr("10.96.0.20")}
	for i := range denied.Ports {
		denied.Ports[i].NodePort = 0
	}
	denied.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.11")}
	denied.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	l.sync(t, allowed, denied)
	if r := mustAsk(t, l.tp.Client, "tcp", netip.AddrPortFrom(lbIP4, 80)); r.Host != "backend-0" {
		t.Errorf("allowed client answered by %s", r.Host)
	}
	if _, err := ask(t, l.tp.Client, "tcp", netip.MustParseAddrPort("203.0.113.11:80")); !errors.Is(err, netnstest.ErrTimeout) {
		t.Errorf("client outside the source ranges: %v, want a drop (timeout)", err)
	}
	if _, err := ask(t, l.tp.Node, "tcp", netip.MustParseAddrPort("203.0.113.11:80")); !errors.Is(err, netnstest.ErrTimeout) {
		t.Errorf("the node, outside the source ranges: %v, want a drop (timeout)", err)
	}
	// Without source ranges the client gets through.
	denied.SourceRanges = nil
	l.sync(t, allowed, denied)
	if r := mustAsk(t, l.tp.Client, "tcp", netip.MustParseAddrPort("203.0.113.11:80")); r.Host != "backend-1" {
		t.Errorf("after removing the source ranges: answered by %s", r.Host)
	}
}

// TestExternalIPs: external IPs answer like the cluster IP.
func TestExternalIPs(t *testing.T) {
	l := newLab(t, 2, nftables.Options{})
	svc := webService(endpoints("", 0, 1)...)
	svc.ExternalIPs = []netip.Addr{externalIP}
	l.sync(t, svc)
	counts := l.tp.Client.Count(t, "udp", netip.AddrPortFrom(externalIP, 80), 40)
	if counts["backend-0"]+counts["backend-1"] != 40 {
		t.Errorf("external IP: %v", counts)
	}
}

// TestStaleUDPFlowMovesOn: a UDP client that keeps its source port moves
// to a new endpoint when its endpoint goes away, because the proxier
// deletes the flow's conntrack entry; without the cleanup it stays on the
// old endpoint.
func TestStaleUDPFlowMovesOn(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		t.Run(fmt.Sprintf("cleanup=%v", cleanup), func(t *testing.T) {
			l := newLab(t, 2, nftables.Options{NoConntrackCleanup: !cleanup})
			svc := webService(endpoints("", 0)...)
			l.sync(t, svc)
			dst := netip.AddrPortFrom(clusterIP4, 80)
			from := netnstest.FromPort(40000)
			if r := mustAsk(t, l.tp.Client, "udp", dst, from); r.Host != "backend-0" {
				t.Fatalf("first answer from %s", r.Host)
			}
			svc.Endpoints = endpoints("", 1)
			l.sync(t, svc)
			want := "backend-1"
			if !cleanup {
				// The old endpoint still runs and answers the old flow.
				want = "backend-0"
			}
			if r := mustAsk(t, l.tp.Client, "udp", dst, from); r.Host != want {
				t.Errorf("after the endpoint changed: answered by %s, want %s", r.Host, want)
			}
		})
	}
}

// lineEcho serves TCP on port in h, echoing every line on a connection
// that stays open.
func lineEcho(t *testing.T, h *netnstest.Host, port uint16) {
	var ln net.Listener
	if err := h.Do(func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(line)); err != nil {
				return
			}
		}
	})
}

// longService starts a topology of one backend that echoes lines on
// port 9000, and returns it with the state of one service whose cluster
// IP's port 80 goes there: a service to hold a connection open through.
func longService(t *testing.T) (*netnstest.Topology, *servicelb.State) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	lineEcho(t, tp.Backends[0], 9000)
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: tp.NodeIPs(), ClusterCIDRs: netnstest.ClusterCIDRs()}
	svc := servicelb.Service{Name: "default/long", ClusterIPs: []netip.Addr{clusterIP4},
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: 9000}},
		Endpoints: endpoints("", 0)}
	return tp, mustState(t, node, svc)
}

// TestRestartKeepsConnections: a new Proxier adopts the table an earlier
// one left (with a leftover chain in it), replaces its content in one
// transaction without deleting the table, and an open TCP connection
// through the service keeps working.
func TestRestartKeepsConnections(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	tp, st := longService(t)
	first, err := nftables.New(nftables.Options{NetNS: tp.Node.NS})
	if err != nil {
		t.Fatal(err)
	}
	mustSync(t, first, st)
	conn := dialLong(t, tp.Client, netip.AddrPortFrom(clusterIP4, 80))
	talk(t, conn, "before")
	first.Close() // the process ends without Cleanup
	tp.Node.Exec(t, "nft", "add", "chain", "inet", "kproxy", "leftover")
	handle := tableHandle(t, tp.Node)

	second := newProxier(t, tp.Node, nftables.Options{})
	mustSync(t, second, st)
	talk(t, conn, "after")
	if h := tableHandle(t, tp.Node); h != handle {
		t.Errorf("table handle %d became %d: the table was deleted and created again", handle, h)
	}
	if out := tp.Node.Exec(t, "nft", "list", "table", "inet", "kproxy"); strings.Contains(out, "leftover") {
		t.Error("the leftover chain survived the first sync")
	}
	talk(t, dialLong(t, tp.Client, netip.AddrPortFrom(clusterIP4, 80)), "new connection")
}

// dialLong opens a TCP connection from h, closed at the end of the test.
func dialLong(t *testing.T, h *netnstest.Host, dst netip.AddrPort) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := h.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", dst.String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// talk sends a line on conn and expects it back.
func talk(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte(msg + "\n")); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

func tableHandle(t *testing.T, h *netnstest.Host) uint64 {
	t.Helper()
	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tb, err := c.Table(context.Background(), nfnl.Inet, nftables.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	return tb.Handle
}

// TestCleanupRefusesNoFlow: connections opened without pause to a
// cluster IP while Cleanup deletes the table meet either the table (and
// its endpoint) or, once it is gone, what the node serves there itself,
// never a refusal: a packet going through the rules as a transaction
// commits reads the rules of before and the sets of after, and one
// transaction deleting both left the dispatch map empty to it beside a
// full set of cluster IPs, whose reject rule refused it (some 10 of
// 300 cycles here).
func TestCleanupRefusesNoFlow(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", backendPort)
	vip := netip.MustParseAddr("10.96.0.10")
	tp.Node.Exec(t, "ip", "address", "add", vip.String()+"/32", "dev", "lo")
	tp.Node.Serve(t, "tcp", 80)
	// A chain of NAT beside the table, as a node's CNI plugin has: the
	// kernel translates a flow's packets by its conntrack entry only
	// while some chain of NAT is registered, so without one every flow
	// the table translated would end with it.
	tp.Node.Exec(t, "nft", "add table ip cni; add chain ip cni postrouting { type nat hook postrouting priority srcnat + 10; }")
	p := newProxier(t, tp.Node, nftables.Options{NoConntrackCleanup: true})
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netnstest.NodeIPv4()}, ClusterCIDRs: netnstest.ClusterCIDRs()}
	st, err := servicelb.NewState(node, servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{vip},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: backendPort}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	// phase is where a failure was seen: with the table, while Cleanup
	// ran, or after it.
	var opened, refused, other, phase atomic.Int64
	var refusals, others sync.Map
	for range 300 {
		if _, err := p.Sync(testCtx(t), st); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				_ = tp.Client.Do(func() error {
					// A whole exchange, so that each connection closes
					// in order and its port is not taken again at once.
					d := net.Dialer{Timeout: 3 * time.Second}
					for {
						select {
						case <-stop:
							return nil
						default:
						}
						c, err := d.Dial("tcp", netip.AddrPortFrom(vip, 80).String())
						opened.Add(1)
						if err == nil {
							_ = c.SetDeadline(time.Now().Add(3 * time.Second))
							if _, err = c.Write([]byte("hello\n")); err == nil {
								_, err = io.ReadAll(c)
							}
							c.Close()
						}
						if err != nil {
							what := fmt.Sprintf("%s: %v", [...]string{"table", "cleanup", "after"}[phase.Load()], err)
							if errors.Is(err, syscall.ECONNREFUSED) {
								refused.Add(1)
								refusals.Store(what, true)
							} else {
								other.Add(1)
								others.Store(what, true)
							}
						}
					}
				})
			})
		}
		for from := opened.Load(); opened.Load() < from+8; {
			time.Sleep(100 * time.Microsecond)
		}
		phase.Store(1)
		if err := p.Cleanup(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		phase.Store(2)
		for from := opened.Load(); opened.Load() < from+8; {
			time.Sleep(100 * time.Microsecond)
		}
		close(stop)
		wg.Wait()
		phase.Store(0)
	}
	list := func(m *sync.Map) []string {
		var msgs []string
		m.Range(func(k, _ any) bool { msgs = append(msgs, k.(string)); return true })
		return msgs
	}
	// Under emulation on a busy machine an exchange across the cleanup
	// has been seen to time out (2 of 5,538): said, not failed on, as the
	// refusal is what the transactions decide.
	if n := other.Load(); n > 0 {
		t.Logf("%d of %d connections failed otherwise than refused: %v", n, opened.Load(), list(&others))
	}
	if n := refused.Load(); n > 0 {
		t.Errorf("%d of %d connections refused across 300 cleanups: %v", n, opened.Load(), list(&refusals))
	}
}
