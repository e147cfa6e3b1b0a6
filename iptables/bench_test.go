//go:build privileged

package iptables

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables/expr"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// BenchmarkColdSync loads n services of 10 endpoints into a fresh
// namespace with one Sync, and, in the same run, the same rules with
// iptables-nft-restore of Render's text into another fresh namespace.
// It reports both times and their ratio (goal: at most 1).
func BenchmarkColdSync(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nft_compat", "nat")
	n := benchSize()
	st := bigState(b, n)
	ctx := context.Background()
	opts := Options{Families: []servicelb.Family{servicelb.IPv4}, NoConntrackCleanup: true}
	var ours, restore time.Duration
	var text string
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		h := netnstest.NewHost(b, "benchcold")
		px := newProxier(b, h, opts)
		b.StartTimer()
		start := time.Now()
		if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
			b.Fatal(err)
		}
		ours += time.Since(start)
		b.StopTimer()
		px.Close()
		// The peak so far covers the state and the sync, not yet the
		// text rendered for iptables-nft-restore.
		peakRSS(b)
		if text == "" {
			var err error
			if text, err = newOffline(b, opts).RenderFamily(st, servicelb.IPv4); err != nil {
				b.Fatal(err)
			}
		}
		r := netnstest.NewHost(b, "benchrestore")
		cmd := exec.Command("iptables-nft-restore")
		cmd.Stdin = strings.NewReader(text)
		start = time.Now()
		if err := r.Run(cmd); err != nil {
			b.Fatalf("iptables-nft-restore: %v", err)
		}
		restore += time.Since(start)
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			b.ReportMetric(float64(ru.Maxrss)/1024, "restore-peak-RSS-MiB")
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ours.Seconds()/float64(b.N), "sync-s")
	b.ReportMetric(restore.Seconds()/float64(b.N), "restore-s")
	b.ReportMetric(ours.Seconds()/restore.Seconds(), "ratio")
	b.ReportMetric(float64(n), "services")
}

// BenchmarkOneServiceChange changes one service's endpoints with n
// services loaded, and, in the same run, measures the kernel's floor: the
// cheapest commit that makes the kernel validate the loaded nat table, as
// every commit adding rules with jumps or x_tables targets does (one rule
// replaced in an otherwise empty chain, jumping to another). It reports
// both times and their ratio (goal: at most 1.2), and the time of a commit
// that changes no rule (an empty chain flushed), which the kernel does not
// validate.
func BenchmarkOneServiceChange(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nft_compat", "nat")
	n := benchSize()
	st := bigState(b, n)
	ctx := context.Background()
	h := netnstest.NewHost(b, "benchchange")
	conn, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	px := newProxier(b, h, Options{Families: []servicelb.Family{servicelb.IPv4}, NoConntrackCleanup: true})
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		b.Fatal(err)
	}
	var setup nfnl.Batch
	for _, c := range []string{"FLOOR", "FLOOR-TARGET", "EMPTY"} {
		setup.AddChain(nfnl.Chain{Family: nfnl.IPv4, Table: "nat", Name: c})
	}
	if _, err := conn.Commit(ctx, &setup); err != nil {
		b.Fatal(err)
	}
	// Alternate between two versions of one service: one endpoint
	// replaced by another.
	svc, _ := st.Service("ns0/svc0")
	alt := *svc
	alt.Endpoints = append(alt.Endpoints[:9:9], servicelb.Endpoint{Addr: netip.MustParseAddr("10.255.255.1")})
	e := st.Edit()
	if err := e.Upsert(alt); err != nil {
		b.Fatal(err)
	}
	states := []*servicelb.State{e.State(), st}
	// The first sync after someone else's commit checks the tables.
	if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
		b.Fatal(err)
	}
	jump := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: "FLOOR-TARGET"}}
	var ours, floor, empty time.Duration
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := servicetest.SyncErr(px.Sync(ctx, states[i%2])); err != nil {
			b.Fatal(err)
		}
		ours += time.Since(start)
		b.StopTimer()
		var fb nfnl.Batch
		fb.FlushChain(nfnl.IPv4, "nat", "FLOOR")
		fb.AddRule(nfnl.Rule{Family: nfnl.IPv4, Table: "nat", Chain: "FLOOR", Exprs: jump})
		start = time.Now()
		if _, err := conn.Commit(ctx, &fb); err != nil {
			b.Fatal(err)
		}
		floor += time.Since(start)
		var eb nfnl.Batch
		eb.FlushChain(nfnl.IPv4, "nat", "EMPTY")
		start = time.Now()
		if _, err := conn.Commit(ctx, &eb); err != nil {
			b.Fatal(err)
		}
		empty += time.Since(start)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(ours.Microseconds())/1000/float64(b.N), "sync-ms")
	b.ReportMetric(float64(floor.Microseconds())/1000/float64(b.N), "floor-ms")
	b.ReportMetric(float64(empty.Microseconds())/1000/float64(b.N), "empty-commit-ms")
	b.ReportMetric(ours.Seconds()/floor.Seconds(), "ratio")
	b.ReportMetric(float64(n), "services")
	peakRSS(b)
}

// BenchmarkRestartSync is a restarted agent's first sync, or a full check:
// a new Proxier reads n services of 10 endpoints back from the kernel and
// finds nothing to change.
func BenchmarkRestartSync(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nft_compat", "nat")
	n := benchSize()
	st := bigState(b, n)
	ctx := context.Background()
	h := netnstest.NewHost(b, "benchrestart")
	opts := Options{Families: []servicelb.Family{servicelb.IPv4}, NoConntrackCleanup: true}
	if err := servicetest.SyncErr(newProxier(b, h, opts).Sync(ctx, st)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		px := newProxier(b, h, opts)
		cc := &countingConn{Conn: px.conn}
		px.conn, px.ap = cc, newApplier(px, cc)
		if err := servicetest.SyncErr(px.Sync(ctx, st)); err != nil {
			b.Fatal(err)
		}
		if cc.batches != 0 {
			b.Fatalf("restart sent %d batches", cc.batches)
		}
		px.Close()
	}
	b.StopTimer()
	b.ReportMetric(float64(n), "services")
	peakRSS(b)
}
