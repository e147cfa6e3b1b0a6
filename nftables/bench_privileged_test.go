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

	"github.com/kproxy-dev/kproxy/internal/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// benchServices returns n services with one TCP port each and k endpoints
// with addresses of their own.
func benchServices(n, k int) []servicelb.Service {
	out := make([]servicelb.Service, n)
	for i := range out {
		eps := make([]servicelb.Endpoint, k)
		for j := range eps {
			x := i*k + j
			eps[j] = servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(64 + x>>16), byte(x >> 8), byte(x)}), Ready: true}
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
		NodeName:     "node",
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

// BenchmarkColdSync writes 10k services x 10 endpoints into an empty
// namespace, and in the same iterations loads the same table's Render text
// with `nft -f`: nft-ms/op over ms/op is the ratio of the two.
func BenchmarkColdSync(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	h := netnstest.NewHost(b, "bench")
	st, err := servicelb.NewState(benchNode(), benchServices(10000, 10)...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var nft time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		p, err := nftables.New(nftables.Options{NetNS: h.NS})
		if err != nil {
			b.Fatal(err)
		}
		text, err := p.Render(st)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := p.Sync(ctx, st); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := p.Cleanup(ctx); err != nil {
			b.Fatal(err)
		}
		_ = p.Close()
		t0 := time.Now()
		h.ExecInput(b, text, "nft", "-f", "-")
		nft += time.Since(t0)
		h.Exec(b, "nft", "delete", "table", "inet", nftables.DefaultTable)
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(nft.Milliseconds())/float64(b.N), "nft-ms/op")
	b.ReportMetric(peakRSS(b), "peak-RSS-MiB")
}

// BenchmarkOneEndpointChange replaces one endpoint of one service, back and
// forth, with the whole table in place.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			netnstest.Require(b, "nf_tables", "nat")
			h := netnstest.NewHost(b, "bench")
			svcs := benchServices(n, 10)
			a, err := servicelb.NewState(benchNode(), svcs...)
			if err != nil {
				b.Fatal(err)
			}
			ed := a.Edit()
			s := svcs[n/2]
			s.Endpoints = append([]servicelb.Endpoint(nil), s.Endpoints...)
			s.Endpoints[3].Addr = netip.MustParseAddr("10.255.0.1")
			if err := ed.Upsert(s); err != nil {
				b.Fatal(err)
			}
			c := ed.State()
			p, err := nftables.New(nftables.Options{NetNS: h.NS})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			if err := p.Sync(ctx, a); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				st := c
				if i%2 == 1 {
					st = a
				}
				if err := p.Sync(ctx, st); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(peakRSS(b), "peak-RSS-MiB")
		})
	}
}
