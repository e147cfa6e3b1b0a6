package servicetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// ScaleNode is the node of the Scale services: node-0, with the cluster
// and service CIDRs they use.
func ScaleNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     "node-0",
		NodeIPs:      []netip.Addr{netip.MustParseAddr("198.51.100.1")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/10")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
}

// Scale returns n ClusterIP services of k ready endpoints each, the shape
// of the scale benchmarks: one TCP port, cluster IPs in 172.16.0.0/12,
// endpoints with addresses of their own in 10.64.0.0/10 spread over 100
// nodes (a tenth of the services have an endpoint on node-0).
func Scale(n, k int) []servicelb.Service {
	out := make([]servicelb.Service, n)
	for i := range out {
		eps := make([]servicelb.Endpoint, k)
		for j := range eps {
			eps[j] = servicelb.Endpoint{Addr: scaleAddr(i*k + j), NodeName: fmt.Sprintf("node-%d", (i*k+j)%100)}
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

func scaleAddr(x int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(64 + x>>16), byte(x >> 8), byte(x)})
}

// ReplaceEndpoint replaces the first endpoint of s by one with an address
// no other endpoint has, numbered gen: the one-endpoint change.
func ReplaceEndpoint(s servicelb.Service, gen int) servicelb.Service {
	eps := append([]servicelb.Endpoint(nil), s.Endpoints...)
	eps[0].Addr = netip.AddrFrom4([4]byte{10, 127, byte(gen >> 8), byte(gen)})
	s.Endpoints = eps
	return s
}

// SyncChanges syncs the services, then makes n one-endpoint changes, one
// Sync each and every apart, as a Runner would hand them over, and returns
// how many Syncs failed (each logged).
func SyncChanges(t testing.TB, p servicelb.Proxier, node servicelb.NodeConfig, svcs []servicelb.Service, n int, every time.Duration) int {
	t.Helper()
	b, err := servicelb.NewBuilder(node)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs {
		if err := b.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if _, err := p.Sync(ctx, b.State()); err != nil {
		t.Fatalf("first sync: %v", err)
	}
	failed := 0
	for i := range n {
		time.Sleep(every)
		if err := b.Upsert(ReplaceEndpoint(svcs[i%len(svcs)], i)); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		if _, err := p.Sync(sctx, b.State()); err != nil {
			t.Logf("sync %d: %v", i, err)
			failed++
		}
		cancel()
	}
	return failed
}

// SyncErr returns the error of a Sync that must apply the whole state:
// its error, joined with the errors of the services it left out, so that
// require.NoError(t, servicetest.SyncErr(p.Sync(ctx, st))) fails when it
// left any out.
func SyncErr(rep servicelb.SyncReport, err error) error { return errors.Join(err, LeftOut(rep)) }

// LeftOut returns the errors of the services a Sync left out, joined in
// the order of their names; nil when it left none out.
func LeftOut(rep servicelb.SyncReport) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(rep.LeftOut)) {
		errs = append(errs, rep.LeftOut[name])
	}
	return errors.Join(errs...)
}
