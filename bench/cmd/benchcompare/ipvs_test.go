package main

import (
	"strings"
	"testing"
)

// A results file of make bench-ipvs: the guest's markers and test output
// around the benchmark lines.
const ipvsOutput = `##vmtest boot 6.1.0-56-cloud-amd64
##vmtest begin ipvs.test
goos: linux
BenchmarkIPVS
BenchmarkIPVS/services=10000/endpoints=10
BenchmarkIPVS/services=10000/endpoints=10-2         	       1	99000000000 ns/op	        24.88 change-ms	         4.000 change-writes	         0.003 change/cold-sync	        12.00 cold-sync-s	         0.2500 cold-sync/ipvsadm-R	         3.00 ipvs-netlink-s	         0.0625 ipvs-netlink/ipvsadm-R	        48.00 ipvsadm-R-s	         9.0 restart-sync-s
BenchmarkIPVSDataPath
BenchmarkIPVSDataPath/services=1000/endpoints=10
BenchmarkIPVSDataPath/services=1000/endpoints=10-2         	       1	4825760100 ns/op	         2.5 cold-sync-s	         0 connect-failures	      2000 connect-p50-us	     8000 connect-p99-us	       1000 connects	      1600 direct-p50-us	     7000 direct-p99-us
BenchmarkIPVSDataPath/services=50000/endpoints=5-2         	       1	4825760100 ns/op	         90 cold-sync-s	         0 connect-failures	      2100 connect-p50-us	     9600 connect-p99-us	       1000 connects	      1500 direct-p50-us	     7100 direct-p99-us
BenchmarkIPVSDataPath/services=50000/endpoints=5-2   garbled
PASS
##vmtest exit ipvs.test 0
`

func TestParseIPVS(t *testing.T) {
	x, err := parseIPVS(strings.NewReader(ipvsOutput))
	if err != nil {
		t.Fatal(err)
	}
	if len(x.ColdSync) != 1 || x.ColdSync[0] != (ipvsCold{N: 10000, M: 10, ColdS: 12, RestoreS: 48, Over: 0.25}) {
		t.Errorf("cold syncs %+v", x.ColdSync)
	}
	if len(x.DataPath) != 2 {
		t.Fatalf("data paths %+v, want 2", x.DataPath)
	}
	p := x.DataPath[1]
	if p.N != 50000 || p.M != 5 || p.ColdS != 90 || *p.Connect != (latency{P50: 2100, P99: 9600, N: 1000}) ||
		*p.Direct != (latency{P50: 1500, P99: 7100, N: 1000}) {
		t.Errorf("50k x 5: %+v %+v %+v", p, *p.Connect, *p.Direct)
	}
	if _, err := parseIPVS(strings.NewReader("PASS\n")); err == nil {
		t.Error("a file without results: no error")
	}
}

func TestIPVSInReport(t *testing.T) {
	rep := &report{}
	md := rep.markdown()
	if !strings.Contains(md, "| IPVS cold sync 10k x 10 over `ipvsadm -R` (VM) | at most 0.5 | not measured (IPVS needs the VM: `make bench-ipvs`) | - |") {
		t.Errorf("no IPVS target row without results:\n%s", md)
	}
	x, err := parseIPVS(strings.NewReader(ipvsOutput))
	if err != nil {
		t.Fatal(err)
	}
	x.Source = "results/ipvs.txt"
	rep.IPVS = x
	md = rep.markdown()
	for _, want := range []string{
		"from `results/ipvs.txt`",
		"Cold sync of 10k services x 10 endpoints (dummy link, addresses, sets and rules included): 12.00 s against 48.00 s for `ipvsadm -R` of the same virtual servers, 0.25x.",
		"| 1k x 10 | 2.5 s | 1600 / 7000 µs | 2000 / 8000 µs | 1.25x |",
		"| 50k x 5 | 90.0 s | 1500 / 7100 µs | 2100 / 9600 µs | 1.40x |",
		"kproxy ipvs, 50k services against 1k: p50 1.05x, p99 1.20x; direct connects, 50k against 1k: p50 0.94x; through the services over direct, 50k against 1k: p50 1.12x.",
		"| IPVS cold sync 10k x 10 over `ipvsadm -R` (VM) | at most 0.5 | 0.25 | yes |",
		"| IPVS first packet p50 over the direct path's, 50k x 5 over 1k x 10 (VM) | at most 1.1 | 1.12 | no |",
		"| IPVS first packet p99 over the direct path's, 50k x 5 over 1k x 10 (VM) | at most 1.1 | 1.18 | no |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
