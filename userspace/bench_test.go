//go:build linux

package userspace

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The data-path benchmarks compare each load through the proxy with the
// same load on a direct connection to the endpoint, interleaved in one
// run, and report both and their ratio (medians of the per-exchange
// times, so that the load of a shared machine weighs on both alike).
// Here everything is on loopback in one namespace; the privileged
// benchmarks repeat them through network namespaces.

// path is a way to reach the benchmark's echo servers: directly or
// through the proxy.
type path struct {
	name           string
	tcp, sink, udp netip.AddrPort
	dial           func(p servicelb.Protocol, to netip.AddrPort) (net.Conn, error)
}

// benchPaths starts a TCP and a UDP echo server and a proxy in front of
// them, all on loopback, and returns the direct path and the proxy's.
func benchPaths(b testing.TB) (direct, proxied path) {
	direct, proxied, _ = benchSetup(b)
	return direct, proxied
}

func benchSetup(b testing.TB) (direct, proxied path, p *Proxier) {
	tcp, sink, udp := startEcho(b, nil), startSink(b, nil), startUDPEcho(b, nil)
	w := &world{real: map[netip.AddrPort]netip.AddrPort{
		netip.AddrPortFrom(epAddr(0), tcpTarget): tcp,
		netip.AddrPortFrom(epAddr(1), tcpTarget): sink,
		netip.AddrPortFrom(epAddr(0), udpTarget): udp,
	}, listen: map[servicelb.ServicePortKey]netip.AddrPort{}}
	// The loads measured here open as many connections to one service
	// as the descriptor limit allows: no flow budget.
	p = newProxier(b, w, Options{MaxFlows: 1 << 30, MaxPortFlows: 1 << 30})
	mustSync(b, p, mustState(b, servicelb.NodeConfig{}, service(1, ep(0)), service(2, ep(1))))
	dial := func(p servicelb.Protocol, to netip.AddrPort) (net.Conn, error) {
		return net.Dial(strings.ToLower(string(p)), to.String())
	}
	return path{"direct", tcp, sink, udp, dial}, path{"proxy", w.at(key(1, "tcp")), w.at(key(2, "tcp")), w.at(key(1, "udp")), dial}, p
}

// startEcho serves TCP echo on loopback (in the namespace of do, when
// set): each connection's bytes go back until its end, then the server
// ends its side.
func startEcho(b testing.TB, do func(func() error) error) netip.AddrPort {
	ln := listenTCP(b, do)
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// listenTCP listens on loopback, or on every address of do's namespace.
func listenTCP(b testing.TB, do func(func() error) error) net.Listener {
	var ln net.Listener
	listen := func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }
	if do != nil {
		listen = func() (err error) { ln, err = net.Listen("tcp", ":0"); return err }
		require.NoError(b, do(listen))
	} else {
		require.NoError(b, listen())
	}
	b.Cleanup(func() { ln.Close() })
	return ln
}

// startUDPEcho answers each datagram with itself.
func startUDPEcho(b testing.TB, do func(func() error) error) netip.AddrPort {
	var pc net.PacketConn
	listen := func() (err error) { pc, err = net.ListenPacket("udp", "127.0.0.1:0"); return err }
	if do != nil {
		listen = func() (err error) { pc, err = net.ListenPacket("udp", ":0"); return err }
		require.NoError(b, do(listen))
	} else {
		require.NoError(b, listen())
	}
	b.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1<<16)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// exchange opens a connection, sends 1 KB, reads the 1 KB echo and
// closes: a request and its response on a new connection.
func exchange(b *testing.B, pa path, buf []byte) time.Duration {
	start := time.Now()
	c, err := pa.dial(servicelb.TCP, pa.tcp)
	if err != nil {
		b.Fatalf("%s: %v", pa.name, err)
	}
	if _, err := c.Write(buf); err != nil {
		b.Fatalf("%s: %v", pa.name, err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		b.Fatalf("%s: %v", pa.name, err)
	}
	d := time.Since(start)
	c.Close()
	return d
}

// interleave runs one round of f on each path per iteration, in turns,
// and reports the medians and their ratio, proxy to direct.
func interleave(b *testing.B, direct, proxied path, unit string, f func(path) float64) {
	var d, p []float64
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			d, p = append(d, f(direct)), append(p, f(proxied))
		} else {
			p, d = append(p, f(proxied)), append(d, f(direct))
		}
	}
	md, mp := median(d), median(p)
	b.ReportMetric(md, "direct-"+unit)
	b.ReportMetric(mp, "proxy-"+unit)
	b.ReportMetric(mp/md, "proxy/direct")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// BenchmarkLatency: a 1 KB request and its 1 KB response, each on a new
// connection (connect, exchange, close); the median time per exchange.
// Target: proxy/direct at most 2.
func BenchmarkLatency(b *testing.B) {
	direct, proxied := benchPaths(b)
	benchLatency(b, direct, proxied)
}

func benchLatency(b *testing.B, direct, proxied path) {
	buf := make([]byte, 1024)
	interleave(b, direct, proxied, "µs", func(pa path) float64 {
		return float64(exchange(b, pa, buf).Nanoseconds()) / 1e3
	})
}

// BenchmarkStream: 1 GiB one way on one connection, to a server that
// counts it and answers with the count; the median throughput. Target:
// proxy/direct at least 0.8.
func BenchmarkStream(b *testing.B) {
	direct, proxied := benchPaths(b)
	benchStream(b, direct, proxied)
}

const streamBytes = 1 << 30

func benchStream(b *testing.B, direct, proxied path) {
	buf := make([]byte, 256<<10)
	// The process's processor time per stream (client, server and proxy
	// all run in it): what the proxy costs, whatever share of the
	// machine's processors the run gets.
	cpu := map[string][]float64{}
	defer func() {
		b.ReportMetric(median(cpu[direct.name]), "direct-cpu-s")
		b.ReportMetric(median(cpu[proxied.name]), "proxy-cpu-s")
	}()
	interleave(b, direct, proxied, "GB/s", func(pa path) float64 {
		start, cpu0 := time.Now(), cpuTime()
		defer func() { cpu[pa.name] = append(cpu[pa.name], cpuTime()-cpu0) }()
		c, err := pa.dial(servicelb.TCP, pa.sink)
		if err != nil {
			b.Fatalf("%s: %v", pa.name, err)
		}
		defer c.Close()
		for sent := 0; sent < streamBytes; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatalf("%s: %v", pa.name, err)
			}
		}
		c.(*net.TCPConn).CloseWrite()
		reply, err := io.ReadAll(c)
		if err != nil || string(reply) != strconv.Itoa(streamBytes) {
			b.Fatalf("%s: the sink counted %q (%v), want %d", pa.name, reply, err, streamBytes)
		}
		return float64(streamBytes) / time.Since(start).Seconds() / 1e9
	})
}

// cpuTime returns the processor time the process has used, in seconds.
func cpuTime() float64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// startSink serves TCP: it reads each connection to its end and answers
// with the number of bytes it read.
func startSink(b testing.TB, do func(func() error) error) netip.AddrPort {
	ln := listenTCP(b, do)
	netnstest.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 256<<10)
		var n int64
		for {
			m, err := c.Read(buf)
			n += int64(m)
			if err == io.EOF {
				io.WriteString(c, strconv.FormatInt(n, 10))
				return
			}
			if err != nil {
				return
			}
		}
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// BenchmarkUDP: a 1 KB datagram and its echo, on one socket per path
// (one session of the proxy); the median round trip. Target:
// proxy/direct at most 2.5.
func BenchmarkUDP(b *testing.B) {
	direct, proxied := benchPaths(b)
	benchUDP(b, direct, proxied)
}

func benchUDP(b *testing.B, direct, proxied path) {
	conns := map[string]net.Conn{}
	for _, pa := range []path{direct, proxied} {
		c, err := pa.dial(servicelb.UDP, pa.udp)
		require.NoError(b, err)
		b.Cleanup(func() { c.Close() })
		conns[pa.name] = c
	}
	buf := make([]byte, 1024)
	interleave(b, direct, proxied, "µs", func(pa path) float64 {
		c := conns[pa.name]
		start := time.Now()
		c.SetReadDeadline(start.Add(2 * time.Second))
		if _, err := c.Write(buf); err != nil {
			b.Fatalf("%s: %v", pa.name, err)
		}
		if _, err := c.Read(buf); err != nil {
			b.Fatalf("%s: %v", pa.name, err)
		}
		return float64(time.Since(start).Nanoseconds()) / 1e3
	})
}

// BenchmarkIdleConnections: 10,000 TCP connections through the proxy,
// open and idle, against the same number of direct ones: the proxy's
// memory per connection (its goroutines' stacks and its heap, measured
// by the runtime after a collection; and the process's resident memory,
// which also counts what the runtime has not returned), and what it keeps
// after they have all closed. KPROXY_BENCH_CONNS=n for another number.
// The process needs four open files per connection (the client's, the
// server's and the proxy's two): it raises its limit when it may, and
// otherwise opens as many connections as the limit allows and says so
// (conns). BenchmarkNetnsIdleConnections also counts the kernel's share.
// Target: at most 20 KiB per connection, no growth.
func BenchmarkIdleConnections(b *testing.B) {
	n := idleConns(b)
	direct, proxied, p := benchSetup(b)
	benchIdle(b, n, direct, proxied, p, nil)
}

// idleConns returns the number of connections of the idle benchmarks.
func idleConns(b *testing.B) int {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("KPROXY_BENCH_CONNS")); err == nil && v > 0 {
		n = v
	}
	n = fileLimitFor(b, n)
	b.Cleanup(func() { b.ReportMetric(float64(n), "conns") })
	return n
}

// benchIdle opens n idle connections on each path in turn and reports
// the proxy's memory per connection; kernel, when set, reads what the
// kernel holds for the proxy's sockets (the sockets of its namespace).
func benchIdle(b *testing.B, n int, direct, proxied path, p *Proxier, kernel func() sockMem) {
	before := runtime.NumGoroutine()
	// A first round grows the runtime's caches (the descriptors of
	// goroutines that ended, which it keeps for new ones) to this load.
	openIdle(b, proxied, n)()
	waitIdle(b, p)
	waitGoroutines(b, before)
	for b.Loop() {
		base, rss0 := goMemory(), residentMemory(b)
		closeAll := openIdle(b, direct, n)
		directCost, directRSS := goMemory()-base, residentMemory(b)-rss0
		closeAll()
		waitGoroutines(b, before)
		var k0, k1 sockMem
		if kernel != nil {
			k0 = kernel()
		}
		base, rss0 = goMemory(), residentMemory(b)
		closeAll = openIdle(b, proxied, n)
		proxyCost, proxyRSS := goMemory()-base, residentMemory(b)-rss0
		if kernel != nil {
			k1 = kernel()
		}
		active := p.activeConns()
		closeAll()
		waitIdle(b, p)
		waitGoroutines(b, before)
		after := goMemory()
		require.Equal(b, int64(n), active, "connections open through the proxy")
		perConn := func(v int64) float64 { return float64(v) / float64(n) }
		b.ReportMetric(perConn(proxyCost-directCost)/1024, "proxy-KiB/conn")
		b.ReportMetric(perConn(proxyRSS-directRSS)/1024, "proxy-rss-KiB/conn")
		b.ReportMetric(perConn(after-base), "kept-B/conn")
		if kernel != nil {
			b.ReportMetric(perConn(k1.inuse-k0.inuse), "kernel-sockets/conn")
			b.ReportMetric(perConn((k1.pages-k0.pages)*int64(os.Getpagesize()))/1024, "sockstat-mem-KiB/conn")
		}
	}
}

// goMemory returns the memory the runtime holds for heap objects and
// goroutine stacks, after a collection.
func goMemory() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

// residentMemory returns the process's resident memory, once the runtime
// has returned what it may to the system.
func residentMemory(b testing.TB) int64 {
	debug.FreeOSMemory()
	statm, err := os.ReadFile("/proc/self/statm")
	require.NoError(b, err)
	f := strings.Fields(string(statm))
	require.GreaterOrEqual(b, len(f), 2, "/proc/self/statm: %q", statm)
	pages, err := strconv.ParseInt(f[1], 10, 64)
	require.NoError(b, err)
	return pages * int64(os.Getpagesize())
}

// sockMem is what /proc/net/sockstat says of a namespace's TCP sockets:
// how many are in use, and the pages their buffers hold.
type sockMem struct{ inuse, pages int64 }

// readSockstat reads the TCP line of a sockstat file ("TCP: inuse 5
// orphan 0 tw 0 alloc 7 mem 1").
func readSockstat(path string) (sockMem, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return sockMem{}, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		var m sockMem
		for i := 1; i+1 < len(f); i += 2 {
			v, err := strconv.ParseInt(f[i+1], 10, 64)
			if err != nil {
				return sockMem{}, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			switch f[i] {
			case "inuse":
				m.inuse = v
			case "mem":
				m.pages = v
			}
		}
		return m, nil
	}
	return sockMem{}, fmt.Errorf("%s: no TCP line", path)
}

// openIdle opens n connections on a path, each exchanging one byte so
// that every side is set up, and returns a function that closes them.
func openIdle(b testing.TB, pa path, n int) func() {
	conns := make([]net.Conn, 0, n)
	one := []byte{1}
	for range n {
		c, err := pa.dial(servicelb.TCP, pa.tcp)
		if err != nil {
			b.Fatalf("%s: connection %d: %v", pa.name, len(conns), err)
		}
		if _, err := c.Write(one); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// fileLimitFor raises the limit of open files for n connections (four
// files each, and a margin) if it may, and returns the number of
// connections the limit allows, at most n.
func fileLimitFor(b testing.TB, n int) int {
	const margin = 1000
	var lim unix.Rlimit
	require.NoError(b, unix.Getrlimit(unix.RLIMIT_NOFILE, &lim))
	if need := uint64(4*n + margin); lim.Cur < need {
		want := unix.Rlimit{Cur: need, Max: max(lim.Max, need)}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err == nil {
			b.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &lim) })
			return n
		}
		b.Logf("%d connections need %d open files; the limit is %d and cannot be raised: %d connections", n, need, lim.Cur, (lim.Cur-margin)/4)
		return int(lim.Cur-margin) / 4
	}
	return n
}

// waitGoroutines waits for the goroutines to be back to n: the servers'
// and the proxy's of connections that ended.
func waitGoroutines(b testing.TB, n int) {
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			b.Fatalf("%d goroutines, want %d", runtime.NumGoroutine(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitIdle waits for the proxy's connections to end.
func waitIdle(b testing.TB, p *Proxier) {
	deadline := time.Now().Add(30 * time.Second)
	for p.activeConns() > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d connections still open through the proxy", p.activeConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncServices returns n services with one TCP port and k endpoints
// each, and a ListenFunc that listens for each at a loopback port of its
// own from base on (below the ephemeral ports, which connections take).
func syncServices(n, k int, base uint16) ([]servicelb.Service, ListenFunc) {
	svcs := make([]servicelb.Service, n)
	at := map[servicelb.ServicePortKey]netip.AddrPort{}
	for i := range svcs {
		eps := make([]servicelb.Endpoint, k)
		for j := range eps {
			x := i*k + j
			eps[j] = servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(64 + x>>16), byte(x >> 8), byte(x)})}
		}
		svcs[i] = servicelb.Service{
			Name:       fmt.Sprintf("ns%d/svc%d", i/100, i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints:  eps,
		}
		at[servicelb.ServicePortKey{Service: svcs[i].Name, Port: "http", Family: servicelb.IPv4}] =
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), base+uint16(i))
	}
	return svcs, ListenAt(at)
}

// benchSyncServices is the number of services of the sync benchmarks.
const benchSyncServices = 1000

// BenchmarkSyncCold: a new proxy's first sync of 1,000 services with 10
// endpoints each, listening on loopback: 1,000 listeners opened (the
// median of the iterations).
// Target: at most 50 ms.
func BenchmarkSyncCold(b *testing.B) {
	svcs, listen := syncServices(benchSyncServices, 10, 21000)
	st := mustState(b, servicelb.NodeConfig{}, svcs...)
	var times []float64
	for b.Loop() {
		p, err := New(Options{Listen: listen})
		require.NoError(b, err)
		start := time.Now()
		require.NoError(b, servicetest.SyncErr(p.Sync(context.Background(), st)))
		times = append(times, float64(time.Since(start).Microseconds())/1e3)
		b.StopTimer()
		require.NoError(b, p.Close())
		b.StartTimer()
	}
	b.ReportMetric(median(times), "sync-ms")
}

// BenchmarkSyncEndpoint: one endpoint of one of 1,000 services changes,
// a sync applies it (the median of the iterations). Target: at most
// 0.1 ms.
func BenchmarkSyncEndpoint(b *testing.B) {
	svcs, listen := syncServices(benchSyncServices, 10, 23000)
	p, err := New(Options{Listen: listen})
	require.NoError(b, err)
	b.Cleanup(func() { p.Close() })
	benchEndpointChange(b, p, svcs)
}

// benchEndpointChange syncs svcs, then in each iteration changes one
// endpoint of one of them and syncs, timing the sync alone.
func benchEndpointChange(b *testing.B, p *Proxier, svcs []servicelb.Service) {
	bld, err := servicelb.NewBuilder(servicelb.NodeConfig{})
	require.NoError(b, err)
	for _, s := range svcs {
		require.NoError(b, bld.Upsert(s))
	}
	require.NoError(b, servicetest.SyncErr(p.Sync(context.Background(), bld.State())))
	var times []float64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		s := svcs[i%len(svcs)]
		s.Endpoints = slices.Clone(s.Endpoints)
		s.Endpoints[0].Addr = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		require.NoError(b, bld.Upsert(s))
		st := bld.State()
		b.StartTimer()
		start := time.Now()
		require.NoError(b, servicetest.SyncErr(p.Sync(context.Background(), st)))
		times = append(times, float64(time.Since(start).Nanoseconds())/1e3)
	}
	b.ReportMetric(median(times), "sync-µs")
}
