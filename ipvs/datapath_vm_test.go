//go:build vm

package ipvs

import (
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork/benchlb"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var (
	dataPathSizes  = flag.String("ipvs.datapath-sizes", "1000x10,10000x10,50000x5", "workload sizes of BenchmarkIPVSDataPath, services x endpoints")
	dataPathProbes = flag.Int("ipvs.probes", 1000, "TCP connections of each data-path probe")
)

// BenchmarkIPVSDataPath measures the first packet through IPVS with the
// comparison's workload loaded (internal/testkit/benchwork: N ClusterIP services
// of M endpoints, the same services and probe as make bench-compare's):
// for each size, a proxier in the node of a topology of its own syncs the
// workload, the backend holds the endpoints of the probed services (the
// first, the middle and the last) and serves TCP, and the client opens
// ipvs.probes connections, each a new flow, round robin over the three
// services' cluster IPs, and as many to three endpoints' own addresses
// (direct: routed by the node, no virtual server), the two in alternate
// rounds. It reports the connect
// times' median and 99th percentile (µs), and the cold sync. Run it with
// -benchtime 1x; make bench-ipvs writes its lines to bench/results.
func BenchmarkIPVSDataPath(b *testing.B) {
	netnstest.Require(b, vmFeatures...)
	sizes, err := parseSizes(*dataPathSizes)
	if err != nil {
		b.Fatal(err)
	}
	for _, sz := range sizes {
		b.Run(fmt.Sprintf("services=%d/endpoints=%d", sz[0], sz[1]), func(b *testing.B) {
			for b.Loop() {
				dataPath(b, sz[0], sz[1])
			}
		})
	}
}

// dataPath measures one size.
func dataPath(b *testing.B, n, m int) {
	tp := netnstest.New(b, netnstest.Options{Backends: 1})
	ws := benchwork.Generate(n, m)
	svcs := make([]servicelb.Service, n)
	for i, w := range ws {
		svcs[i] = benchlb.Service(w)
	}
	st, err := servicelb.NewState(benchlb.Node(tp.NodeIPs()...), svcs...)
	if err != nil {
		b.Fatal(err)
	}
	svcs = nil
	p, err := New(Options{NetNS: tp.Node.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	cold := timedErr(b, func() error { return servicetest.SyncErr(p.Sync(b.Context(), st)) })
	var vips, direct []string
	for _, i := range benchwork.Probed(n) {
		vips = append(vips, netip.AddrPortFrom(ws[i].VIP, 80).String())
		for _, e := range ws[i].Endpoints {
			tp.Backends[0].AddAddress(b, netip.PrefixFrom(e.Addr, 32))
			if len(direct) < 3 {
				direct = append(direct, netip.AddrPortFrom(e.Addr, 8080).String())
			}
		}
	}
	ws = nil
	tp.Backends[0].Serve(b, "tcp", 8080)
	through, routed, err := probeBoth(tp, vips, direct, *dataPathProbes)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(cold.Seconds(), "cold-sync-s")
	b.ReportMetric(through.P50, "connect-p50-us")
	b.ReportMetric(through.P99, "connect-p99-us")
	b.ReportMetric(float64(through.N), "connects")
	b.ReportMetric(float64(through.Failed), "connect-failures")
	b.ReportMetric(routed.P50, "direct-p50-us")
	b.ReportMetric(routed.P99, "direct-p99-us")
}

// probeBoth makes n connections through the services and n direct ones
// from the client (benchwork.ConnectBoth).
func probeBoth(tp *netnstest.Topology, vips, direct []string, n int) (through, routed benchwork.Latency, err error) {
	err = tp.Client.Do(func() (err error) {
		through, routed, err = benchwork.ConnectBoth(vips, direct, n, 2*time.Second)
		return err
	})
	return through, routed, err
}

// parseSizes reads "NxM,..." sizes.
func parseSizes(s string) ([][2]int, error) {
	var out [][2]int
	for _, f := range strings.Split(s, ",") {
		a, c, ok := strings.Cut(strings.TrimSpace(f), "x")
		n, err1 := strconv.Atoi(a)
		m, err2 := strconv.Atoi(c)
		if !ok || err1 != nil || err2 != nil || n < 3 || m < 1 {
			return nil, fmt.Errorf("bad size %q (want NxM, N at least 3)", f)
		}
		out = append(out, [2]int{n, m})
	}
	return out, nil
}
