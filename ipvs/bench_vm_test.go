//go:build vm

package ipvs

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var benchServices = flag.Int("ipvs.bench-services", 10000, "services (of 10 endpoints each) in the ipvs benchmarks")

// benchEndpoint returns endpoint j of service i: distinct addresses in
// 100.64.0.0/10.
func benchEndpoint(i, j int) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], 100<<24|64<<16+uint32(i*10+j+1))
	return netip.AddrFrom4(b)
}

// benchService returns service i: a cluster IP in 10.96.0.0/12, TCP port
// 80 to 8080, 10 endpoints; first is the index of its first endpoint.
func benchService(i, first int) servicelb.Service {
	var cip [4]byte
	binary.BigEndian.PutUint32(cip[:], 10<<24|96<<16+uint32(i+1))
	s := servicelb.Service{
		Name: fmt.Sprintf("bench/svc-%d", i), ClusterIPs: []netip.Addr{netip.AddrFrom4(cip)},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 80, TargetPort: 8080}},
	}
	for j := first; j < first+10; j++ {
		s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: benchEndpoint(i, j%10)})
	}
	return s
}

// BenchmarkIPVS measures, in one run, against ipvsadm -R of the same
// virtual servers: a cold sync of n services of 10 endpoints into a fresh
// namespace (dummy link, addresses, sets and rules included), the IPVS
// part alone (the same netlink calls Sync makes), a restart's sync of the
// unchanged state, and a one-endpoint change. Its name carries the size
// (services=n/endpoints=10). Run it with -benchtime 1x.
func BenchmarkIPVS(b *testing.B) {
	netnstest.Require(b, vmFeatures...)
	n := *benchServices
	b.Run(fmt.Sprintf("services=%d/endpoints=10", n), func(b *testing.B) { benchColdSync(b, n) })
}

func benchColdSync(b *testing.B, n int) {
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netnstest.NodeIPv4()}}
	svcs := make([]servicelb.Service, n)
	for i := range svcs {
		svcs[i] = benchService(i, 0)
	}
	st, err := servicelb.NewState(node, svcs...)
	if err != nil {
		b.Fatal(err)
	}
	o, _ := Options{}.withDefaults()
	plan, err := buildModel(st, &o)
	if err != nil {
		b.Fatal(err)
	}
	servers := slices.Collect(maps.Values(plan.servers))
	save := RenderVirtualServers(servers)
	for b.Loop() {
		restore := timeRestore(b, save)
		ipvsOnly := timeIPVSOnly(b, servers)
		h := netnstest.NewHost(b, "bench-sync")
		p, err := New(Options{NetNS: h.NS})
		if err != nil {
			b.Fatal(err)
		}
		cold := timedErr(b, func() error { return servicetest.SyncErr(p.Sync(b.Context(), st)) })
		p.Close()
		p, err = New(Options{NetNS: h.NS})
		if err != nil {
			b.Fatal(err)
		}
		restart := timedErr(b, func() error { return servicetest.SyncErr(p.Sync(b.Context(), st)) })
		bld := st.Edit()
		changed := benchService(n/2, 1) // one endpoint replaced
		changed.Endpoints[9].Addr = a("100.127.255.1")
		if err := bld.Upsert(changed); err != nil {
			b.Fatal(err)
		}
		writes := p.writes()
		change := timedErr(b, func() error { return servicetest.SyncErr(p.Sync(b.Context(), bld.State())) })
		writes = p.writes() - writes
		p.Close()
		b.ReportMetric(restore.Seconds(), "ipvsadm-R-s")
		b.ReportMetric(ipvsOnly.Seconds(), "ipvs-netlink-s")
		b.ReportMetric(cold.Seconds(), "cold-sync-s")
		b.ReportMetric(ipvsOnly.Seconds()/restore.Seconds(), "ipvs-netlink/ipvsadm-R")
		b.ReportMetric(cold.Seconds()/restore.Seconds(), "cold-sync/ipvsadm-R")
		b.ReportMetric(restart.Seconds(), "restart-sync-s")
		b.ReportMetric(float64(change.Microseconds())/1000, "change-ms")
		b.ReportMetric(change.Seconds()/cold.Seconds(), "change/cold-sync")
		b.ReportMetric(float64(writes), "change-writes")
	}
}

// timeIPVSOnly creates the virtual servers and real servers through the
// same kernel calls Sync makes (a batch of virtual servers, then one of
// real servers), in a fresh namespace, and times it.
func timeIPVSOnly(b *testing.B, servers []*VirtualServer) time.Duration {
	h := netnstest.NewHost(b, "bench-netlink")
	k, err := openKernel(b.Context(), h.NS, DefaultInterface)
	if err != nil {
		b.Fatal(err)
	}
	defer k.close()
	return timedErr(b, func() error {
		var svcs, reals []ipvsOp
		for _, vs := range servers {
			svcs = append(svcs, ipvsOp{kind: newService, vs: vs})
			for _, r := range vs.Real {
				reals = append(reals, ipvsOp{kind: newReal, vs: vs, r: r})
			}
		}
		for _, ops := range [][]ipvsOp{svcs, reals} {
			if err := firstErrors(k.write(b.Context(), ops)); err != nil {
				return err
			}
		}
		return nil
	})
}

// timeRestore times `ipvsadm -R` of save in a fresh namespace.
func timeRestore(b *testing.B, save string) time.Duration {
	h := netnstest.NewHost(b, "bench-ipvsadm")
	cmd := exec.CommandContext(b.Context(), "ipvsadm", "-R")
	cmd.Stdin = strings.NewReader(save)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := h.Run(cmd); err != nil {
		b.Fatalf("ipvsadm -R: %v\n%s", err, out.String())
	}
	return time.Since(start)
}

func timedErr(b *testing.B, f func() error) time.Duration {
	b.Helper()
	start := time.Now()
	if err := f(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
