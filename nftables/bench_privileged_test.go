//go:build privileged

package nftables_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// benchServices returns n services with one TCP port each and k endpoints
// with addresses of their own, spread over 100 nodes as a cluster's pods
// would be (the benchmark's node is node-0).
func benchServices(n, k int) []servicelb.Service {
	out := make([]servicelb.Service, n)
	for i := range out {
		eps := make([]servicelb.Endpoint, k)
		for j := range eps {
			x := i*k + j
			eps[j] = servicelb.Endpoint{
				Addr:     netip.AddrFrom4([4]byte{10, byte(64 + x>>16), byte(x >> 8), byte(x)}),
				NodeName: "node-" + strconv.Itoa(x%100),
			}
		}
		out[i] = servicelb.Service{
			Name:       fmt.Sprintf("ns%d/svc%d", i/100, i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints:  eps,
		}
	}
	return out
}

func benchNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     "node-0",
		NodeIPs:      []netip.Addr{netip.MustParseAddr("198.51.100.1")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/10")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
}

// peakRSS returns the process's peak resident set size in MiB (VmHWM).
func peakRSS(b *testing.B) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return float64(kb) / 1024
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// BenchmarkColdSync writes 10k services x 10 endpoints into an empty table
// with a fresh Proxier (ns/op, and sync-ms/op), and in the same iterations
// loads the same table's Render text with the real `nft -f` (nft-ms/op);
// nft/sync is the ratio of the two. peak-RSS-MiB is the test process's
// peak resident memory (the states, the model, the batch).
func BenchmarkColdSync(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	h := netnstest.NewHost(b, "bench")
	st, err := servicelb.NewState(benchNode(), benchServices(10000, 10)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var sync, nft time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
		if err != nil {
			b.Fatal(err)
		}
		text, err := p.Render(st)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil {
			b.Fatal(err)
		}
		sync += time.Since(t0)
		b.StopTimer()
		if err := p.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
		_ = p.Close()
		t0 = time.Now()
		h.ExecInput(b, text, "nft", "-f", "-")
		nft += time.Since(t0)
		h.Exec(b, "nft", "delete", "table", "inet", nftables.DefaultTable)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(sync.Microseconds())/1000/float64(b.N), "sync-ms/op")
	b.ReportMetric(float64(nft.Microseconds())/1000/float64(b.N), "nft-ms/op")
	b.ReportMetric(float64(nft)/float64(sync), "nft/sync")
	b.ReportMetric(peakRSS(b), "peak-RSS-MiB")
}

// changer is a proxier over n services that adds one endpoint to one
// service and takes it away again, turn by turn.
type changer struct {
	h    *netnstest.Host
	p    *nftables.Proxier
	a, c *servicelb.State
	i    int
}

func newChanger(b *testing.B, n int) *changer {
	h := netnstest.NewHost(b, "bench")
	svcs := benchServices(n, 10)
	a, err := servicelb.NewState(benchNode(), svcs...)
	if err != nil {
		b.Fatal(err)
	}
	ed := a.Edit()
	s := svcs[n/2]
	s.Endpoints = append(append([]servicelb.Endpoint(nil), s.Endpoints...),
		servicelb.Endpoint{Addr: netip.MustParseAddr("10.255.0.1"), NodeName: "node-7"})
	if err := ed.Upsert(s); err != nil {
		b.Fatal(err)
	}
	p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	if err := servicetest.SyncErr(p.Sync(context.Background(), a)); err != nil {
		b.Fatal(err)
	}
	return &changer{h: h, p: p, a: a, c: ed.State()}
}

func (c *changer) step(b *testing.B) time.Duration {
	st := c.c
	if c.i%2 == 1 {
		st = c.a
	}
	c.i++
	t0 := time.Now()
	if err := servicetest.SyncErr(c.p.Sync(context.Background(), st)); err != nil {
		b.Fatal(err)
	}
	return time.Since(t0)
}

// floor returns the average time of the cheapest element change the kernel
// commits in the changer's namespace: one element added to and deleted
// from a small set in a table of its own, n times. The kernel's cost of
// any set element commit grows with the rules loaded in the namespace,
// whichever table the set is in (a commit that only flushes an empty chain
// does not). It commits outside the Proxier's table, but it still makes
// the Proxier read its table back on its next Sync, so it runs after the
// changes are timed.
func (c *changer) floor(b *testing.B, n int) time.Duration {
	conn, err := nfnl.Open(nfnl.Options{NetNS: int(c.h.NS)})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var total time.Duration
	for _, d := range elementCommits(b, conn, n) {
		total += d
	}
	return total / time.Duration(n)
}

// elementCommits times n of the cheapest element commit the kernel makes
// in conn's namespace: one element added to and deleted from a small set
// in a table of its own ("floor", made on the first call).
func elementCommits(b *testing.B, conn *nfnl.Conn, n int) []time.Duration {
	ctx := context.Background()
	var setup nfnl.Batch
	setup.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "floor"})
	setup.AddSet(nfnl.Set{Family: nfnl.IPv4, Table: "floor", Name: "s", KeyType: 7, KeyLen: 4}) // ipv4_addr
	if _, err := conn.Commit(ctx, &setup); err != nil {
		b.Fatal(err)
	}
	el := []nfnl.Element{{Key: []byte{10, 1, 2, 3}}}
	d := make([]time.Duration, n)
	for i := range d {
		var fb nfnl.Batch
		fb.AddElements(nfnl.IPv4, "floor", "s", el)
		fb.DelElements(nfnl.IPv4, "floor", "s", el)
		t0 := time.Now()
		if _, err := conn.Commit(ctx, &fb); err != nil {
			b.Fatal(err)
		}
		d[i] = time.Since(t0)
	}
	return d
}

// BenchmarkOneEndpointChange adds an endpoint to one service and removes it
// again, turn by turn, with 1k and with 10k services in place (each in its
// own namespace), one change of each per iteration: small-us/op and
// large-us/op are their costs, large/small their ratio. Then, in the same
// namespaces, it measures the kernel's floor for each (small-floor-us,
// large-floor-us: see changer.floor) and reports the ratio of what the
// changes cost above their floors (large/small-above-floor).
func BenchmarkOneEndpointChange(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	small, large := newChanger(b, 1000), newChanger(b, 10000)
	var ts, tl time.Duration
	b.ResetTimer()
	for range b.N {
		ts += small.step(b)
		tl += large.step(b)
	}
	b.StopTimer()
	fs, fl := small.floor(b, max(b.N, 100)), large.floor(b, max(b.N, 100))
	as, al := ts/time.Duration(b.N), tl/time.Duration(b.N)
	b.ReportMetric(float64(as.Nanoseconds())/1000, "small-us/op")
	b.ReportMetric(float64(al.Nanoseconds())/1000, "large-us/op")
	b.ReportMetric(float64(tl)/float64(ts), "large/small")
	b.ReportMetric(float64(fs.Nanoseconds())/1000, "small-floor-us")
	b.ReportMetric(float64(fl.Nanoseconds())/1000, "large-floor-us")
	b.ReportMetric(float64(al-fl)/float64(as-fs), "large/small-above-floor")
	b.ReportMetric(peakRSS(b), "peak-RSS-MiB")
}

// BenchmarkServiceChange adds a service and removes it again with 10k
// services in place: chains and rules change, so the kernel validates the
// table on each commit.
func BenchmarkServiceChange(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	h := netnstest.NewHost(b, "bench")
	svcs := benchServices(10000, 10)
	a, err := servicelb.NewState(benchNode(), svcs[1:]...)
	if err != nil {
		b.Fatal(err)
	}
	ed := a.Edit()
	if err := ed.Upsert(svcs[0]); err != nil {
		b.Fatal(err)
	}
	c := ed.State()
	p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := servicetest.SyncErr(p.Sync(ctx, a)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		st := c
		if i%2 == 1 {
			st = a
		}
		if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckAfterForeignCommit: with 10k services in place, someone
// else commits (to another table) before each Sync of the unchanged state,
// so each Sync reads its table back and compares it with its plan.
func BenchmarkCheckAfterForeignCommit(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	h := netnstest.NewHost(b, "bench")
	st, err := servicelb.NewState(benchNode(), benchServices(10000, 10)...)
	if err != nil {
		b.Fatal(err)
	}
	p, err := nftables.New(nftables.Options{NetNS: h.NS, NoConntrackCleanup: true})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil {
		b.Fatal(err)
	}
	other, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		b.Fatal(err)
	}
	defer other.Close()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		var foreign nfnl.Batch
		if i%2 == 0 {
			foreign.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "someone-else"})
		} else {
			foreign.DelTable(nfnl.IPv4, "someone-else")
		}
		if _, err := other.Commit(ctx, &foreign); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := servicetest.SyncErr(p.Sync(ctx, st)); err != nil {
			b.Fatal(err)
		}
	}
}
