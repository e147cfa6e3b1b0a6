//go:build privileged

package ebpf_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	kebpf "github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// benchEnv is a private cgroup v2 mount and bpffs for a benchmark.
func benchEnv(b *testing.B) *ebpftest.Env {
	b.Helper()
	netnstest.Require(b, "nf_tables", "nat")
	e, err := ebpftest.New(testPrefix)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := e.Close(); err != nil {
			b.Error(err)
		}
	})
	return e
}

func scaleState(b *testing.B, n, k int) (*servicelb.State, []servicelb.Service) {
	svcs := servicetest.Scale(n, k)
	st, err := servicelb.NewState(servicetest.ScaleNode(), svcs...)
	if err != nil {
		b.Fatal(err)
	}
	return st, svcs
}

// newBenchLB returns a Proxier as an agent makes one: attached to the
// env's cgroup, its maps and links pinned under pins on the env's bpf
// filesystem (so that every sync checks the pins, as an agent's does).
func newBenchLB(b *testing.B, e *ebpftest.Env, ns *netnstest.Host, pins string) *kebpf.Proxier {
	p, err := kebpf.New(kebpf.Options{Cgroup: e.Cgroup, NetNS: ns.NS, PinPath: filepath.Join(e.BPFFS, pins)})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// requirePinned fails the benchmark unless the Proxier with pins pinned
// its eight links and eight maps.
func requirePinned(b *testing.B, e *ebpftest.Env, pins string) {
	got, err := filepath.Glob(filepath.Join(e.BPFFS, pins, "*"))
	if err != nil || len(got) != 16 {
		b.Fatalf("pins under %s: %v (%v), want 8 links and 8 maps", pins, got, err)
	}
}

func newBenchNFT(b *testing.B, h *netnstest.Host) *nftables.Proxier {
	p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func timed(b *testing.B, p servicelb.Proxier, st *servicelb.State) time.Duration {
	t0 := time.Now()
	if err := servicetest.SyncErr(p.Sync(context.Background(), st)); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// BenchmarkColdSync writes 10k services x 10 endpoints into empty maps
// with a fresh Proxier (its hooks attached once the maps are full), and
// in the same iterations the same state into an empty namespace with a
// fresh nftables Proxier: ebpf-ms and nft-ms are their times, ebpf/nft
// their ratio (goal: at most 0.5).
func BenchmarkColdSync(b *testing.B) {
	e := benchEnv(b)
	st, _ := scaleState(b, 10000, 10)
	var ours, nft time.Duration
	for range b.N {
		h := netnstest.NewHost(b, "benchcold")
		p := newBenchLB(b, e, h, "cold")
		ours += timed(b, p, st)
		requirePinned(b, e, "cold")
		if err := p.Cleanup(context.Background()); err != nil {
			b.Fatal(err)
		}
		p.Close()
		n := newBenchNFT(b, h)
		nft += timed(b, n, st)
		n.Cleanup(context.Background())
		n.Close()
	}
	b.ReportMetric(float64(ours.Microseconds())/1000/float64(b.N), "ebpf-ms")
	b.ReportMetric(float64(nft.Microseconds())/1000/float64(b.N), "nft-ms")
	b.ReportMetric(float64(ours)/float64(nft), "ebpf/nft")
}

// BenchmarkOneEndpointChange replaces one endpoint of one service with
// 10k services loaded, turn by turn, on this Proxier and on the nftables
// backend, one change of each per iteration (ebpf-us, nft-us, ebpf/nft:
// goal at most 0.1), and on this Proxier with 1k services loaded too
// (small-us; large/small: a change costs what changed, not what is
// there).
func BenchmarkOneEndpointChange(b *testing.B) {
	e := benchEnv(b)
	type changer struct {
		p    servicelb.Proxier
		bld  *servicelb.Builder
		svcs []servicelb.Service
		took time.Duration
	}
	newChanger := func(p servicelb.Proxier, n int) *changer {
		_, svcs := scaleState(b, n, 10)
		bld, err := servicelb.NewBuilder(servicetest.ScaleNode())
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range svcs {
			if err := bld.Upsert(s); err != nil {
				b.Fatal(err)
			}
		}
		timed(b, p, bld.State())
		return &changer{p: p, bld: bld, svcs: svcs}
	}
	step := func(c *changer, i int) {
		s := c.svcs[len(c.svcs)/2]
		if err := c.bld.Upsert(servicetest.ReplaceEndpoint(s, i)); err != nil {
			b.Fatal(err)
		}
		c.took += timed(b, c.p, c.bld.State())
	}
	h := netnstest.NewHost(b, "benchchange")
	lb := newBenchLB(b, e, h, "large")
	defer lb.Close()
	nft := newBenchNFT(b, h)
	defer nft.Close()
	small := newBenchLB(b, e, netnstest.NewHost(b, "benchsmall"), "small")
	defer small.Close()
	large, nftc, smallc := newChanger(lb, 10000), newChanger(nft, 10000), newChanger(small, 1000)
	requirePinned(b, e, "large")
	requirePinned(b, e, "small")
	runtime.GC() // the setup's garbage is not the changes'
	b.ResetTimer()
	for i := range b.N {
		step(large, i)
		step(nftc, i)
		step(smallc, i)
	}
	b.StopTimer()
	per := func(c *changer) float64 { return float64(c.took.Nanoseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(per(large), "ebpf-us")
	b.ReportMetric(per(nftc), "nft-us")
	b.ReportMetric(per(smallc), "small-us")
	b.ReportMetric(per(large)/per(nftc), "ebpf/nft")
	b.ReportMetric(per(large)/per(smallc), "large/small")
	lb.Cleanup(context.Background())
	small.Cleanup(context.Background())
}

// kernelMemory is benchwork.KernelMemory, failing the benchmark on an
// error.
func kernelMemory(b *testing.B) int64 {
	n, err := benchwork.KernelMemory()
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkSteadyMemory loads 10k services x 10 endpoints with each
// backend in turn and reports what stays once the sync is done: the Go
// heap the Proxier keeps (heap-MiB) and the kernel memory its objects
// take (kernel-MiB: maps and programs, or the nf_tables table), and the
// ratio of their sums (ebpf/nft: goal at most 1).
func BenchmarkSteadyMemory(b *testing.B) {
	e := benchEnv(b)
	st, _ := scaleState(b, 10000, 10)
	measure := func(open func(h *netnstest.Host) servicelb.Proxier) (int64, int64) {
		h := netnstest.NewHost(b, "benchmem")
		// What the last measure freed reaches the kernel's counters
		// first (maps and tables are freed after an RCU grace period),
		// lest this one be charged less than it takes.
		time.Sleep(time.Second)
		h0, k0 := benchwork.Heap(), kernelMemory(b)
		p := open(h)
		timed(b, p, st)
		time.Sleep(time.Second) // freed objects reach the kernel's counters
		h1, k1 := benchwork.Heap(), kernelMemory(b)
		runtime.KeepAlive(p)
		p.Cleanup(context.Background())
		p.(io.Closer).Close()
		return h1 - h0, k1 - k0
	}
	var eh, ek, nh, nk int64
	for range b.N {
		h, k := measure(func(h *netnstest.Host) servicelb.Proxier { return newBenchLB(b, e, h, "memory") })
		eh, ek = eh+h, ek+k
		h, k = measure(func(h *netnstest.Host) servicelb.Proxier { return newBenchNFT(b, h) })
		nh, nk = nh+h, nk+k
	}
	mib := func(v int64) float64 { return float64(v) / float64(b.N) / (1 << 20) }
	b.ReportMetric(mib(eh), "ebpf-heap-MiB")
	b.ReportMetric(mib(ek), "ebpf-kernel-MiB")
	b.ReportMetric(mib(nh), "nft-heap-MiB")
	b.ReportMetric(mib(nk), "nft-kernel-MiB")
	b.ReportMetric(float64(eh+ek)/float64(nh+nk), "ebpf/nft")
}

// dataPath is a node with one endpoint host serving TCP echo and a sink,
// a service whose cluster IP this package's hooks balance, and another
// whose cluster IP the nftables backend translates (DNAT), both to the
// same endpoint.
type dataPath struct {
	tp                 *netnstest.Topology
	direct, vip, nftIP netip.AddrPort
}

const sinkPort = 9000

func newDataPath(b *testing.B, e *ebpftest.Env) *dataPath {
	tp := netnstest.New(b, netnstest.Options{Backends: 1})
	// The node's flows to the nftables service's address need a route to
	// reach its output hook.
	tp.Node.AddRoute(b, netip.Prefix{}, tp.Client.IPv4)
	be := tp.Backends[0]
	be.Serve(b, "tcp", 8080)
	var ln net.Listener
	if err := be.Do(func() (err error) { ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", sinkPort)); return err }); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	netnstest.ServeConns(ln, func(c net.Conn) { io.Copy(io.Discard, c); c.Close() })
	d := &dataPath{tp: tp, direct: netip.AddrPortFrom(be.IPv4, sinkPort),
		vip: netip.MustParseAddrPort("10.96.0.10:80"), nftIP: netip.MustParseAddrPort("10.96.0.20:80")}
	svc := func(name string, ip netip.Addr) servicelb.Service {
		return servicelb.Service{Name: name, ClusterIPs: []netip.Addr{ip},
			Ports: []servicelb.Port{{Name: "echo", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080},
				{Name: "sink", Protocol: servicelb.TCP, Port: sinkPort, TargetPort: sinkPort}},
			Endpoints: []servicelb.Endpoint{{Addr: be.IPv4}}}
	}
	n := servicelb.NodeConfig{ClusterCIDRs: netnstest.ClusterCIDRs()}
	lbState, err := servicelb.NewState(n, svc("bench/lb", d.vip.Addr()))
	if err != nil {
		b.Fatal(err)
	}
	nftState, err := servicelb.NewState(n, svc("bench/nft", d.nftIP.Addr()))
	if err != nil {
		b.Fatal(err)
	}
	lb := newBenchLB(b, e, tp.Node, "datapath")
	nft := newBenchNFT(b, tp.Node)
	timed(b, lb, lbState)
	timed(b, nft, nftState)
	b.Cleanup(func() {
		lb.Cleanup(context.Background())
		lb.Close()
		nft.Cleanup(context.Background())
		nft.Close()
	})
	return d
}

// enterCgroup moves this process (the test binary, which the benchmark
// started) into the cgroup, so that the sockets it makes meet the hooks,
// and back to where it was when the benchmark ends.
func enterCgroup(b *testing.B, e *ebpftest.Env) {
	back, err := e.Enter()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := back(); err != nil {
			b.Error(err)
		}
	})
}

// connectTimes connects n times to each of dsts from the node (connect,
// then close), one destination after the other, so that the load of the
// machine weighs on each alike, and returns the times by destination.
func connectTimes(b *testing.B, node *netnstest.Host, dsts []netip.AddrPort, n int) [][]time.Duration {
	out := make([][]time.Duration, len(dsts))
	err := node.Do(func() error {
		for range n {
			for i, dst := range dsts {
				t0 := time.Now()
				c, err := net.Dial("tcp4", dst.String())
				if err != nil {
					return err
				}
				out[i] = append(out[i], time.Since(t0))
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// streams sends size bytes to each of dsts from the node, each on a
// connection of its own, in slices of 64 MiB taken in turn, so that the
// load of the machine weighs on each alike, and returns the rates in
// GB/s.
func streams(b *testing.B, node *netnstest.Host, dsts []netip.AddrPort, size int64) []float64 {
	conns := make([]net.Conn, len(dsts))
	for i, dst := range dsts {
		if err := node.Do(func() (err error) { conns[i], err = net.Dial("tcp4", dst.String()); return err }); err != nil {
			b.Fatal(err)
		}
		defer conns[i].Close()
	}
	const slice = 64 << 20
	buf := make([]byte, 1<<20)
	took := make([]time.Duration, len(dsts))
	for sent := int64(0); sent < size; sent += slice {
		for i, c := range conns {
			t0 := time.Now()
			for n := 0; n < slice; n += len(buf) {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			took[i] += time.Since(t0)
		}
	}
	out := make([]float64, len(dsts))
	for i, c := range conns {
		c.(*net.TCPConn).CloseWrite()
		out[i] = float64(size) / took[i].Seconds() / 1e9
	}
	return out
}

// BenchmarkDataPath measures, from the node's own sockets in the cgroup,
// TCP connect times and the rate of a 1 GiB stream to one endpoint:
// directly, through a cluster IP this package's hooks balance (vip), and
// through one the nftables backend translates (nft, for comparison), in
// five rounds. A round makes 800 connects to each (the three destinations
// taken in turn) and sends a 1 GiB stream to each (in 64 MiB slices taken
// in turn), so that the load of the machine weighs on each alike; each
// round gives a ratio of medians against the direct path. The verdicts
// (the goal: the vip within 5% of the direct path) are the medians of
// the rounds' ratios, so that no one round decides: vip-connect-ok and
// vip-stream-ok are 1 when met, and the log says so in words.
func BenchmarkDataPath(b *testing.B) {
	e := benchEnv(b)
	d := newDataPath(b, e)
	enterCgroup(b, e)
	node := d.tp.Node
	echo := func(a netip.AddrPort) netip.AddrPort {
		if a == d.direct {
			return netip.AddrPortFrom(a.Addr(), 8080)
		}
		return a
	}
	sinkOf := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr(), sinkPort) }
	echoes := []netip.AddrPort{echo(d.direct), d.vip, d.nftIP}
	sinks := []netip.AddrPort{sinkOf(d.direct), sinkOf(d.vip), sinkOf(d.nftIP)}
	const rounds, connects, size, tolerance = 5, 800, 1 << 30, 0.05
	// By path (direct, vip, nft): each round's median connect time (µs)
	// and stream rate (GB/s).
	var connect, rate [3][]float64
	for range b.N {
		for range rounds {
			for i, ts := range connectTimes(b, node, echoes, connects) {
				connect[i] = append(connect[i], medianMicros(ts))
			}
			for i, r := range streams(b, node, sinks, size) {
				rate[i] = append(rate[i], r)
			}
		}
	}
	ratios := func(xs [3][]float64, path int) []float64 {
		out := make([]float64, len(xs[0]))
		for r := range out {
			out[r] = xs[path][r] / xs[0][r]
		}
		return out
	}
	vipConnect, nftConnect := benchwork.Judge(ratios(connect, 1), tolerance), benchwork.Judge(ratios(connect, 2), tolerance)
	vipStream, nftStream := benchwork.Judge(ratios(rate, 1), tolerance), benchwork.Judge(ratios(rate, 2), tolerance)
	b.ReportMetric(benchwork.Median(connect[0]), "direct-connect-us")
	b.ReportMetric(benchwork.Median(connect[1]), "vip-connect-us")
	b.ReportMetric(benchwork.Median(connect[2]), "nft-connect-us")
	b.ReportMetric(vipConnect.Ratio, "vip/direct-connect")
	b.ReportMetric(nftConnect.Ratio, "nft/direct-connect")
	b.ReportMetric(benchwork.Median(rate[0]), "direct-GB/s")
	b.ReportMetric(benchwork.Median(rate[1]), "vip-GB/s")
	b.ReportMetric(benchwork.Median(rate[2]), "nft-GB/s")
	b.ReportMetric(vipStream.Ratio, "vip/direct-stream")
	b.ReportMetric(nftStream.Ratio, "nft/direct-stream")
	b.ReportMetric(met(vipConnect), "vip-connect-ok")
	b.ReportMetric(met(vipStream), "vip-stream-ok")
	b.Logf("TCP connect through the service's address against a direct connect: %s (nftables DNAT: %s)", vipConnect, nftConnect)
	b.Logf("1 GiB stream through the service's address against a direct one: %s (nftables DNAT: %s)", vipStream, nftStream)
}

func medianMicros(ds []time.Duration) float64 {
	us := make([]float64, len(ds))
	for i, d := range ds {
		us[i] = float64(d.Nanoseconds()) / 1000
	}
	return benchwork.Median(us)
}

// met is 1 for a verdict met, 0 for one not met.
func met(v benchwork.Verdict) float64 {
	if v.Within() {
		return 1
	}
	return 0
}
