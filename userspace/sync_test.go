//go:build linux

package userspace

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// listenerOf returns the listener of a service port's first frontend.
func listenerOf(t *testing.T, p *Proxier, w *world, k servicelb.ServicePortKey) *listener {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	proto := servicelb.TCP
	if k.Port == "udp" {
		proto = servicelb.UDP
	}
	l := p.listeners[listenKey{proto: proto, at: w.at(k)}]
	require.NotNil(t, l, "no listener for %s", k)
	return l
}

// TestSyncTouchesOnlyChanges: a sync that changes one service's
// endpoints keeps every listener (that service's too), so connections
// waiting to be accepted are not lost; a connection already open goes
// on; the other services' tables are not rebuilt.
func TestSyncTouchesOnlyChanges(t *testing.T) {
	w := newWorld(t, 2)
	p := newProxier(t, w, Options{})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(0))))
	l1, l2 := listenerOf(t, p, w, key(1, "tcp")), listenerOf(t, p, w, key(2, "tcp"))
	u1 := listenerOf(t, p, w, key(1, "udp"))
	tab2 := p.ports[key(2, "tcp")].tab.Load()
	c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	_, err = r.ReadString('\n')
	require.NoError(t, err)

	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(1)), service(2, ep(0))))
	assert.Same(t, l1, listenerOf(t, p, w, key(1, "tcp")), "the changed port's listener was replaced")
	assert.Same(t, u1, listenerOf(t, p, w, key(1, "udp")), "the changed port's UDP listener was replaced")
	assert.Same(t, l2, listenerOf(t, p, w, key(2, "tcp")))
	assert.Same(t, tab2, p.ports[key(2, "tcp")].tab.Load(), "an unchanged port's table was rebuilt")
	assert.Len(t, count(t, w.at(key(1, "tcp")), 40), 2, "the new endpoint takes no connection")
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	_, err = r.ReadByte()
	require.NoError(t, err)
}

// TestListenerMovesBetweenPorts: a listen address that passes from one
// service port to another in one sync keeps its listener.
func TestListenerMovesBetweenPorts(t *testing.T) {
	w := newWorld(t, 2)
	at := freePort(t)
	listen := func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		return at, sp.Port.Protocol == servicelb.TCP
	}
	p := newProxier(t, w, Options{Listen: listen})
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0))))
	k := listenKey{proto: servicelb.TCP, at: at}
	l := p.listeners[k]
	require.NotNil(t, l)
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(2, ep(1))))
	assert.Same(t, l, p.listeners[k])
	assert.Equal(t, "ep-1", askTCP(t, at))
}

// TestListenClash: two frontends that Listen puts at one address: the
// second service is left out with ErrFrontendTaken, the first served.
func TestListenClash(t *testing.T) {
	w := newWorld(t, 2)
	at := freePort(t)
	listen := func(sp *servicelb.ServicePort, f servicelb.Frontend) (netip.AddrPort, bool) {
		return at, sp.Port.Protocol == servicelb.TCP
	}
	p := newProxier(t, w, Options{Listen: listen})
	rep, err := p.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(1))))
	require.NoError(t, err)
	assert.ErrorIs(t, servicetest.LeftOut(rep), servicelb.ErrFrontendTaken)
	assert.Contains(t, rep.LeftOut, "ns/svc2")
	assert.Equal(t, "ep-0", askTCP(t, at))
	_, err = p.Render(mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(1))))
	assert.ErrorIs(t, err, servicelb.ErrFrontendTaken, "Render and Sync disagree")
}

// TestTakenAddressLeftOut: a frontend someone else listens on leaves its
// service out (ErrFrontendTaken, a *ListenError) and the rest is served;
// once the service changes and the address is free, it is served.
func TestTakenAddressLeftOut(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	// Pick the listen addresses, then take service 2's.
	st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(0)))
	for _, sp := range st.Ports() {
		w.listenFunc(t)(sp, sp.Frontends()[0])
	}
	squatter, err := net.Listen("tcp", w.at(key(2, "tcp")).String())
	require.NoError(t, err)
	rep, err := p.Sync(context.Background(), st)
	require.NoError(t, err)
	err = servicetest.LeftOut(rep)
	require.ErrorIs(t, err, servicelb.ErrFrontendTaken)
	var le *ListenError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, []string{"ns/svc2"}, keys(rep.LeftOut))
	assert.Equal(t, "ep-0", askTCP(t, w.at(key(1, "tcp"))))
	p.mu.Lock()
	assert.Nil(t, p.ports[key(2, "udp")], "a left-out service's other ports are served")
	p.mu.Unlock()

	squatter.Close()
	s2 := service(2, ep(0))
	s2.Ports[0].TargetPort = tcpTarget // unchanged
	s2.Endpoints = append(s2.Endpoints, weighted(0, ep(3)))
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), s2))
	assert.Equal(t, "ep-0", askTCP(t, w.at(key(2, "tcp"))))
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestUnsupportedLeftOut: a service the capabilities refuse (an unknown
// scheduler hint) is left out with servicelb's error, the rest served.
func TestUnsupportedLeftOut(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	bad := service(2, ep(0))
	bad.Scheduler = servicelb.SchedulerMaglev
	err := servicesLeftOut(t)(p.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, service(1, ep(0)), bad)))
	require.ErrorIs(t, err, servicelb.ErrUnsupported)
	var ve *servicelb.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "ns/svc2", ve.Service)
	assert.Equal(t, "ep-0", askTCP(t, w.at(key(1, "tcp"))))
}

// TestBrokenListenerRepaired: a listener whose socket failed is opened
// again by the next sync, which writes the whole state.
func TestBrokenListenerRepaired(t *testing.T) {
	w := newWorld(t, 1)
	p := newProxier(t, w, Options{})
	st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))
	mustSync(t, p, st)
	l := listenerOf(t, p, w, key(1, "tcp"))
	// Break it as a failed accept would.
	l.broken.Store(true)
	p.broken.Add(1)
	l.f.Close()
	<-l.done
	ok, err := (*engine)(p).Check(context.Background())
	require.NoError(t, err)
	assert.False(t, ok, "Check did not see the broken listener")
	mustSync(t, p, st)
	assert.NotSame(t, l, listenerOf(t, p, w, key(1, "tcp")))
	assert.Equal(t, "ep-0", askTCP(t, w.at(key(1, "tcp"))))
}

// TestCleanupAndCloseLeakNothing: Cleanup closes every listener,
// connection and session, leaves no goroutine, and a later Sync serves
// again; Close does the same for good.
func TestCleanupAndCloseLeakNothing(t *testing.T) {
	w := newWorld(t, 2)
	before := runtime.NumGoroutine()
	p, err := New(Options{Listen: w.listenFunc(t)})
	require.NoError(t, err)
	p.socks.redirect = w.redirect
	st := mustState(t, servicelb.NodeConfig{}, service(1, ep(0), ep(1)), service(2, ep(1)))
	mustSync(t, p, st)
	var open []net.Conn
	for range 5 {
		c, err := net.Dial("tcp", w.at(key(1, "tcp")).String())
		require.NoError(t, err)
		_, err = bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		open = append(open, c)
		askUDP(t, w.at(key(2, "udp")))
	}
	assert.Equal(t, int64(5), stats(t, p, key(1, "tcp")).Active)
	assert.Equal(t, int64(5), stats(t, p, key(2, "udp")).Active)
	assert.Greater(t, runtime.NumGoroutine(), before+10)

	require.NoError(t, p.Cleanup(context.Background()))
	waitGoroutinesT(t, before)
	for _, c := range open {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		assert.Error(t, err)
		assert.False(t, isTimeout(err), "a connection outlived Cleanup")
		c.Close()
	}
	assert.Empty(t, p.Stats())

	mustSync(t, p, st)
	assert.Equal(t, "ep-1", askTCP(t, w.at(key(2, "tcp"))))
	require.NoError(t, p.Close())
	waitGoroutinesT(t, before)
	assert.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), st)), servicelb.ErrClosed)
	assert.ErrorIs(t, p.Cleanup(context.Background()), servicelb.ErrClosed)
}

func waitGoroutinesT(t *testing.T, n int) {
	t.Helper()
	// Polled here: testify's Eventually runs goroutines of its own.
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines left running: %d, want %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
	}
}

// TestNoState: a nil or zero State is refused, as by every backend.
func TestNoState(t *testing.T) {
	p, err := New(Options{})
	require.NoError(t, err)
	defer p.Close()
	assert.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), nil)), servicelb.ErrNoState)
	assert.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), &servicelb.State{})), servicelb.ErrNoState)
}

// TestInvalidOptions: options that make no sense are refused by New.
func TestInvalidOptions(t *testing.T) {
	for _, o := range []Options{
		{ConnectTimeout: -1}, {DialAttempts: -1}, {UDPIdleTimeout: -1}, {MaxUDPSessions: -1}, {DrainTimeout: -1},
		{Link: "a-name-longer-than-15"}, {MaxFlows: -1}, {MaxPortFlows: -1}, {UDPStreamTimeout: -1},
		{StrictARP: true}, // guards held addresses: needs HoldAddresses
	} {
		_, err := New(o)
		assert.ErrorIs(t, err, ErrInvalidOptions, "%+v", o)
	}
}

// TestListenAtGivesNoAddress: a Listen function that gives no usable
// address leaves the service out, naming it.
func TestListenAtGivesNoAddress(t *testing.T) {
	p, err := New(Options{Listen: func(*servicelb.ServicePort, servicelb.Frontend) (netip.AddrPort, bool) {
		return netip.MustParseAddrPort("0.0.0.0:80"), true
	}})
	require.NoError(t, err)
	defer p.Close()
	err = servicesLeftOut(t)(p.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, service(1, ep(0)))))
	assert.ErrorIs(t, err, ErrInvalidOptions)
	var ve *servicelb.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "ns/svc1", ve.Service)
}

// TestFrontendsOnTheirOwnAddresses: without Listen each frontend listens
// on its own address: node ports on 127.0.0.1 (LocalhostNodePorts), here
// the one address a test may bind.
func TestFrontendsOnTheirOwnAddresses(t *testing.T) {
	w := newWorld(t, 1)
	p, err := New(Options{})
	require.NoError(t, err)
	defer p.Close()
	p.socks.redirect = w.redirect
	s := service(1, ep(0))
	np := freePort(t).Port()
	for i := range s.Ports {
		s.Ports[i].NodePort = np
	}
	// The node's address is no address of this host, and the node-port
	// addresses hold the loopback network alone: node ports are served
	// on 127.0.0.1 alone.
	node := servicelb.NodeConfig{
		NodeIPs:            []netip.Addr{netip.MustParseAddr("203.0.113.1")},
		NodePortAddresses:  []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		LocalhostNodePorts: true,
		NodePortRange:      servicelb.PortRange{Min: 1024, Max: 65535},
	}
	err = servicesLeftOut(t)(p.Sync(context.Background(), mustState(t, node, s)))
	// The cluster IP is no address of this host: without HoldAddresses
	// the service is left out, naming the address.
	require.Error(t, err)
	var le *ListenError
	require.ErrorAs(t, err, &le)
	assert.Contains(t, le.Error(), "10.96.0.1:")

	s.ClusterIPs = nil
	mustSync(t, p, mustState(t, node, s))
	at := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), np)
	assert.Equal(t, "ep-0", askTCP(t, at))
	name, from := askUDP(t, at)
	assert.Equal(t, "ep-0", name)
	assert.Equal(t, at, from)
}

// TestOrigins: the origin of a flow, told by its source address as
// servicelb defines it.
func TestOrigins(t *testing.T) {
	nd := newNode(servicelb.NodeConfig{
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		NodeIPs:      []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		LocalIPs:     []netip.Addr{netip.MustParseAddr("192.0.2.9")},
	})
	vip := netip.MustParseAddr("10.96.0.1")
	for _, tc := range []struct {
		src  string
		want servicelb.Origin
	}{
		{"10.244.3.4", servicelb.FromPod},
		{"10.96.0.1", servicelb.FromNode}, // the node reaching an address it holds sends from it
		{"127.0.0.1", servicelb.FromNode},
		{"192.0.2.1", servicelb.FromNode},
		{"192.0.2.9", servicelb.FromNode},
		{"198.51.100.7", servicelb.FromOutside},
	} {
		assert.Equal(t, tc.want, nd.origin(netip.MustParseAddr(tc.src), vip, nil), tc.src)
	}
}

// TestOriginsByInterface: under the interface detections, a flow that
// came in on the pods' interface (or one whose name starts with the
// prefix) is a pod's, whatever its address; others are told by address.
func TestOriginsByInterface(t *testing.T) {
	vip, pod := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.244.1.7")
	on := func(name string) func() string { return func() string { return name } }
	bridge := newNode(servicelb.NodeConfig{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		DetectLocal: servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"}})
	assert.Equal(t, servicelb.FromPod, bridge.origin(pod, vip, on("cbr0")))
	assert.Equal(t, servicelb.FromOutside, bridge.origin(pod, vip, on("cbr01")), "the cluster CIDRs do not count")
	assert.Equal(t, servicelb.FromOutside, bridge.origin(pod, vip, on("")), "an unknown interface")
	assert.Equal(t, servicelb.FromNode, bridge.origin(netip.MustParseAddr("127.0.0.1"), vip, on("lo")))
	prefix := newNode(servicelb.NodeConfig{
		DetectLocal: servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}})
	assert.Equal(t, servicelb.FromPod, prefix.origin(pod, vip, on("veth12ab")))
	assert.Equal(t, servicelb.FromPod, prefix.origin(netip.MustParseAddr("fd00::7"), vip, on("veth0")))
	assert.Equal(t, servicelb.FromOutside, prefix.origin(pod, vip, on("eth0")))
	called := false
	byAddr := newNode(servicelb.NodeConfig{})
	byAddr.origin(pod, vip, func() string { called = true; return "" })
	assert.False(t, called, "the interface is looked up only for a node that tells pods by it")
}

// TestOriginsNodeCIDR: under the NodeCIDR detection, the node's own pod
// CIDRs tell its pods; a source elsewhere in the cluster CIDRs (another
// node's pod) comes from outside.
func TestOriginsNodeCIDR(t *testing.T) {
	nd := newNode(servicelb.NodeConfig{
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
		DetectLocal: servicelb.DetectLocal{Mode: servicelb.LocalByNodeCIDR,
			NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}},
	})
	vip := netip.MustParseAddr("10.96.0.1")
	assert.Equal(t, servicelb.FromPod, nd.origin(netip.MustParseAddr("10.244.1.7"), vip, nil))
	assert.Equal(t, servicelb.FromPod, nd.origin(netip.MustParseAddr("fd00:244:1::7"), netip.MustParseAddr("fd00:96::1"), nil))
	assert.Equal(t, servicelb.FromOutside, nd.origin(netip.MustParseAddr("10.244.2.7"), vip, nil))
}

// TestDecideSourceRanges: a load-balancer frontend drops the flows of
// sources outside its ranges; the port's other frontends do not.
func TestDecideSourceRanges(t *testing.T) {
	s := service(1, ep(0))
	s.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("203.0.113.1")}
	s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	st := mustState(t, servicelb.NodeConfig{}, s)
	sp := st.Port(key(1, "tcp"))
	ps := newPortState(sp)
	ps.update(sp)
	nd := newNode(servicelb.NodeConfig{})
	in, out := netip.MustParseAddr("198.51.100.3"), netip.MustParseAddr("192.0.2.3")
	lb := sp.LoadBalancerIPs[0]
	assert.Equal(t, servicelb.ToCluster, ps.decide(nd, servicelb.LoadBalancerFrontend, in, lb, nil).action)
	assert.Equal(t, servicelb.Drop, ps.decide(nd, servicelb.LoadBalancerFrontend, out, lb, nil).action)
	assert.Equal(t, servicelb.ToCluster, ps.decide(nd, servicelb.ClusterIPFrontend, out, sp.ClusterIP, nil).action)
}

// TestCapabilities: what the proxy declares, and that the errors of a
// capability it lacks are servicelb's.
func TestCapabilities(t *testing.T) {
	var p Proxier
	c := p.Capabilities()
	assert.Equal(t, "userspace", c.Backend)
	for _, f := range []servicelb.Features{servicelb.FeaturePreserveSource, servicelb.FeaturePacketVerdicts, servicelb.FeatureServiceCIDRs,
		servicelb.FeatureUndefinedPorts} {
		assert.False(t, c.Features.Has(f), f.String())
	}
	held := Proxier{o: Options{HoldAddresses: true}}
	assert.True(t, held.Capabilities().Features.Has(servicelb.FeatureUndefinedPorts), "the kernel refuses the closed ports of held cluster IPs")
	assert.False(t, held.Capabilities().Features.Has(servicelb.FeatureNoARPAnswers), "the node answers ARP for held addresses")
	strict := Proxier{o: Options{HoldAddresses: true, StrictARP: true}}
	assert.True(t, strict.Capabilities().Features.Has(servicelb.FeatureNoARPAnswers), "StrictARP keeps them unanswered")
	assert.True(t, c.Features.Has(servicelb.FeatureNoARPAnswers), "a proxy that holds nothing claims nothing")
	elsewhere := Proxier{o: Options{HoldAddresses: true, Listen: ListenAt(nil)}}
	assert.False(t, elsewhere.Capabilities().Features.Has(servicelb.FeatureUndefinedPorts), "Options.Listen may leave the cluster IPs unheld")
	for _, f := range []servicelb.Features{servicelb.FeatureAffinity, servicelb.FeatureAffinityExpiry, servicelb.FeatureWeights,
		servicelb.FeatureSourceRanges, servicelb.FeatureLocalhostNodePorts, servicelb.FeatureLocalByInterface} {
		assert.True(t, c.Features.Has(f), f.String())
	}
	assert.Zero(t, c.MaxEndpoints)
	assert.True(t, c.AcceptsScheduler(servicelb.SchedulerWeightedRR))
	assert.False(t, c.AcceptsScheduler(servicelb.SchedulerMaglev))
	assert.True(t, errors.Is(c.CheckService(&servicelb.Service{Name: "a", Scheduler: servicelb.SchedulerLeastConn}), servicelb.ErrUnsupported))
}

// servicesLeftOut returns a function that checks that a Sync succeeded and
// returns the errors of the services it left out, joined.
func servicesLeftOut(t *testing.T) func(servicelb.SyncReport, error) error {
	return func(rep servicelb.SyncReport, err error) error {
		t.Helper()
		require.NoError(t, err)
		return servicetest.LeftOut(rep)
	}
}
