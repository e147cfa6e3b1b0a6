package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// ipvsResults are the IPVS backend's measurements, which make bench-ipvs
// takes in a qemu VM (this kind of host's kernel has no IPVS): its cold
// sync against ipvsadm -R of the same virtual servers (BenchmarkIPVS), and
// the first packet through it with the comparison's workload
// (BenchmarkIPVSDataPath). Times are the emulated machine's: they compare
// with each other, not with the host's figures.
type ipvsResults struct {
	Source   string // the file they were read from
	ColdSync []ipvsCold
	DataPath []ipvsPath
}

// ipvsCold is one BenchmarkIPVS line: the cold sync, ipvsadm -R and their
// ratio, in seconds.
type ipvsCold struct {
	N, M                  int
	ColdS, RestoreS, Over float64
}

// ipvsPath is one BenchmarkIPVSDataPath line.
type ipvsPath struct {
	N, M    int
	ColdS   float64
	Connect *latency
	Direct  *latency
}

func (p ipvsPath) size() size { return size{p.N, p.M} }

// readIPVS reads the benchmark lines of make bench-ipvs's output file (Go
// benchmark format; other lines are left aside).
func readIPVS(path string) (*ipvsResults, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := parseIPVS(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out.Source = path
	return out, nil
}

func parseIPVS(r io.Reader) (*ipvsResults, error) {
	out := &ipvsResults{}
	s := bufio.NewScanner(r)
	for s.Scan() {
		name, metrics, ok := benchLine(s.Text())
		if !ok {
			continue
		}
		base, params := splitName(name)
		n, m := params["services"], params["endpoints"]
		if n == 0 || m == 0 {
			continue
		}
		switch base {
		case "BenchmarkIPVS":
			out.ColdSync = append(out.ColdSync, ipvsCold{N: n, M: m, ColdS: metrics["cold-sync-s"],
				RestoreS: metrics["ipvsadm-R-s"], Over: metrics["cold-sync/ipvsadm-R"]})
		case "BenchmarkIPVSDataPath":
			out.DataPath = append(out.DataPath, ipvsPath{N: n, M: m, ColdS: metrics["cold-sync-s"],
				Connect: &latency{P50: metrics["connect-p50-us"], P99: metrics["connect-p99-us"], N: int(metrics["connects"])},
				Direct:  &latency{P50: metrics["direct-p50-us"], P99: metrics["direct-p99-us"], N: int(metrics["connects"])}})
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if len(out.ColdSync) == 0 && len(out.DataPath) == 0 {
		return nil, fmt.Errorf("no BenchmarkIPVS or BenchmarkIPVSDataPath result")
	}
	return out, nil
}

// benchLine splits a Go benchmark result line ("BenchmarkX/a=1-2  1
// 5 ns/op  0.4 unit ...") into its name, without the GOMAXPROCS suffix,
// and its metrics by unit.
func benchLine(line string) (string, map[string]float64, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
		return "", nil, false
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return "", nil, false
	}
	metrics := map[string]float64{}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return "", nil, false
		}
		metrics[f[i+1]] = v
	}
	name := f[0]
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i]
		}
	}
	return name, metrics, true
}

// splitName splits "BenchmarkX/services=10/endpoints=5" into its base and
// its numeric key=value parts.
func splitName(name string) (string, map[string]int) {
	parts := strings.Split(name, "/")
	params := map[string]int{}
	for _, p := range parts[1:] {
		if k, v, ok := strings.Cut(p, "="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				params[k] = n
			}
		}
	}
	return parts[0], params
}

// findIPVS returns the data-path result of one size, nil if none.
func (rep *report) findIPVS(sz size) *ipvsPath {
	if rep.IPVS == nil {
		return nil
	}
	for i := range rep.IPVS.DataPath {
		if rep.IPVS.DataPath[i].size() == sz {
			return &rep.IPVS.DataPath[i]
		}
	}
	return nil
}

// ipvsMarkdown renders the IPVS section: the cold sync against ipvsadm -R
// and the first packet by size, each against a direct connect of the
// same run.
func (rep *report) ipvsMarkdown(b *strings.Builder) {
	x := rep.IPVS
	if x == nil {
		return
	}
	fmt.Fprintf(b, "**IPVS** (`make bench-ipvs`, in a qemu VM under TCG emulation on this machine, from `%s`: absolute times are the emulator's and compare only with each other; the first packet goes through the same topology, client namespace to node to backend namespace, and workload as above)\n\n", x.Source)
	for _, c := range x.ColdSync {
		fmt.Fprintf(b, "Cold sync of %s services x %d endpoints (dummy link, addresses, sets and rules included): %.2f s against %.2f s for `ipvsadm -R` of the same virtual servers, %.2fx.\n\n", count(c.N), c.M, c.ColdS, c.RestoreS, c.Over)
	}
	if len(x.DataPath) == 0 {
		return
	}
	b.WriteString("| size | cold sync | direct | kproxy ipvs | over direct (p50) |\n|---|---|---|---|---|\n")
	for _, p := range x.DataPath {
		over := "-"
		if p.Direct != nil && p.Direct.P50 > 0 && p.Connect != nil {
			over = fmt.Sprintf("%.2fx", p.Connect.P50/p.Direct.P50)
		}
		fmt.Fprintf(b, "| %s | %.1f s | %s | %s | %s |\n", p.size(), p.ColdS, lat(p.Direct), lat(p.Connect), over)
	}
	b.WriteString("\n")
	small, large := rep.findIPVS(size{1000, 10}), rep.findIPVS(size{50000, 5})
	if small != nil && large != nil && small.Connect.P50 > 0 && small.Connect.P99 > 0 {
		fmt.Fprintf(b, "kproxy ipvs, 50k services against 1k: p50 %.2fx, p99 %.2fx", large.Connect.P50/small.Connect.P50, large.Connect.P99/small.Connect.P99)
		if small.Direct != nil && large.Direct != nil && small.Direct.P50 > 0 && large.Direct.P50 > 0 {
			// The emulated machine slows as a whole with the state it holds:
			// the direct connects of the same rounds tell how much.
			fmt.Fprintf(b, "; direct connects, 50k against 1k: p50 %.2fx; through the services over direct, 50k against 1k: p50 %.2fx",
				large.Direct.P50/small.Direct.P50, (large.Connect.P50/large.Direct.P50)/(small.Connect.P50/small.Direct.P50))
		}
		b.WriteString(".\n\n")
	}
}
