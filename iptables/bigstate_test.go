//go:build linux

package iptables

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// benchSize returns the number of services for the benchmarks: 10000, or
// KPROXY_BENCH_SERVICES.
func benchSize() int {
	if n, err := strconv.Atoi(os.Getenv("KPROXY_BENCH_SERVICES")); err == nil && n > 0 {
		return n
	}
	return 10000
}

// bigState returns n ClusterIP services of 10 endpoints each.
func bigState(tb testing.TB, n int) *servicelb.State {
	tb.Helper()
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: addrs("198.51.100.1"),
		ClusterCIDRs: prefixes("10.0.0.0/8"), ServiceCIDRs: prefixes("172.16.0.0/12")}
	b, err := servicelb.NewBuilder(node)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		s := servicelb.Service{Name: fmt.Sprintf("ns%d/svc%d", i%100, i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}}}
		for j := range 10 {
			k := i*10 + j
			s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}),
				NodeName: fmt.Sprintf("node-%d", j)})
		}
		if err := b.Upsert(s); err != nil {
			tb.Fatal(err)
		}
	}
	return b.State()
}

// peakRSS reports the process's peak resident set size so far.
func peakRSS(b *testing.B) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		b.ReportMetric(float64(ru.Maxrss)/1024, "peak-RSS-MiB")
	}
}
