//go:build privileged

package userspace

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The data-path benchmarks again, through network namespaces: the client
// in its namespace, the proxy in the node's with the cluster IPs held on
// its loopback, the servers on an endpoint host; the direct path is the
// client to the endpoint's own address, routed by the node.

// nsPaths builds the topology, the servers, the proxy and its services.
func nsPaths(b testing.TB) (direct, proxied path, p *Proxier) {
	direct, proxied, p, _ = nsTopology(b)
	return direct, proxied, p
}

// nsTopology is nsPaths, with the topology.
func nsTopology(b testing.TB) (direct, proxied path, p *Proxier, tp *netnstest.Topology) {
	tp = netnstest.New(b, netnstest.Options{Backends: 1})
	be := tp.Backends[0]
	tcp, sink, udp := startEcho(b, be.Do), startSink(b, be.Do), startUDPEcho(b, be.Do)
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true})
	require.NoError(b, err)
	b.Cleanup(func() {
		p.Cleanup(context.Background())
		p.Close()
	})
	vip := func(i byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, 0, i}) }
	eps := []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}}
	svc := func(i byte, proto servicelb.Protocol, target uint16) servicelb.Service {
		return servicelb.Service{Name: "bench/svc" + string('0'+rune(i)), ClusterIPs: []netip.Addr{vip(i)},
			Ports: []servicelb.Port{{Protocol: proto, Port: 80, TargetPort: target}}, Endpoints: eps}
	}
	st := mustState(b, servicelb.NodeConfig{NodeName: "node", NodeIPs: tp.NodeIPs(), ClusterCIDRs: netnstest.ClusterCIDRs()},
		svc(1, servicelb.TCP, tcp.Port()), svc(2, servicelb.TCP, sink.Port()), svc(3, servicelb.UDP, udp.Port()))
	require.NoError(b, servicetest.SyncErr(p.Sync(context.Background(), st)))
	dial := clientDialer(b, tp.Client)
	at := func(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	be4 := netnstest.BackendIPv4(0)
	direct = path{"direct", at(be4, tcp.Port()), at(be4, sink.Port()), at(be4, udp.Port()), dial}
	proxied = path{"proxy", at(vip(1), 80), at(vip(2), 80), at(vip(3), 80), dial}
	return direct, proxied, p, tp
}

// clientDialer connects from the client's namespace: its sockets are
// made by a thread there.
func clientDialer(b testing.TB, h *netnstest.Host) func(servicelb.Protocol, netip.AddrPort) (net.Conn, error) {
	th, err := startNSThread(h.NS)
	require.NoError(b, err)
	b.Cleanup(th.stop)
	s := &sockets{ns: th}
	return func(proto servicelb.Protocol, to netip.AddrPort) (net.Conn, error) {
		f, err := s.connect(proto, to, 5*time.Second)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return net.FileConn(f)
	}
}

// BenchmarkNetnsLatency is BenchmarkLatency through namespaces.
func BenchmarkNetnsLatency(b *testing.B) {
	direct, proxied, _ := nsPaths(b)
	benchLatency(b, direct, proxied)
}

// BenchmarkNetnsStream is BenchmarkStream through namespaces.
func BenchmarkNetnsStream(b *testing.B) {
	direct, proxied, _ := nsPaths(b)
	benchStream(b, direct, proxied)
}

// BenchmarkNetnsUDP is BenchmarkUDP through namespaces.
func BenchmarkNetnsUDP(b *testing.B) {
	direct, proxied, _ := nsPaths(b)
	benchUDP(b, direct, proxied)
}

// BenchmarkNetnsIdleConnections is BenchmarkIdleConnections through
// namespaces, where the node's namespace holds the proxy's sockets alone:
// it also reports the kernel's share as /proc/net/sockstat there counts
// it, the TCP sockets in use per connection (the proxy's two) and the
// memory of their buffers (its "mem" pages), which idle sockets leave
// near zero: the kernel counts those pages in per-processor batches, so a
// figure that small may come out slightly negative.
func BenchmarkNetnsIdleConnections(b *testing.B) {
	n := idleConns(b)
	direct, proxied, p, tp := nsTopology(b)
	benchIdle(b, n, direct, proxied, p, func() sockMem {
		var m sockMem
		require.NoError(b, tp.Node.Do(func() (err error) {
			// /proc/net would show the namespace of the process's main
			// thread; thread-self shows this thread's.
			m, err = readSockstat("/proc/thread-self/net/sockstat")
			return err
		}))
		return m
	})
}

// BenchmarkNetnsSyncCold: a new proxy's first sync of 1,000 services
// with 10 endpoints each in a namespace, holding their 1,000 cluster IPs
// on its loopback (and listening on them); the addresses are removed
// between iterations. Target: at most 50 ms.
func BenchmarkNetnsSyncCold(b *testing.B) {
	h := netnstest.NewHost(b, "node")
	svcs, _ := syncServices(benchSyncServices, 10, 0)
	st := mustState(b, servicelb.NodeConfig{}, svcs...)
	var times []float64
	for b.Loop() {
		p, err := New(Options{NetNS: h.NS, HoldAddresses: true})
		require.NoError(b, err)
		start := time.Now()
		require.NoError(b, servicetest.SyncErr(p.Sync(context.Background(), st)))
		times = append(times, float64(time.Since(start).Microseconds())/1e3)
		b.StopTimer()
		require.NoError(b, p.Cleanup(context.Background()))
		require.NoError(b, p.Close())
		b.StartTimer()
	}
	b.ReportMetric(median(times), "sync-ms")
}

// BenchmarkNetnsSyncEndpoint: one endpoint of one of 1,000 services with
// held addresses changes. Target: at most 0.1 ms.
func BenchmarkNetnsSyncEndpoint(b *testing.B) {
	h := netnstest.NewHost(b, "node")
	svcs, _ := syncServices(benchSyncServices, 10, 0)
	p, err := New(Options{NetNS: h.NS, HoldAddresses: true})
	require.NoError(b, err)
	b.Cleanup(func() { p.Close() })
	benchEndpointChange(b, p, svcs)
}
