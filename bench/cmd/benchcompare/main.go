// Command benchcompare measures kproxy's nftables and iptables backends
// against kube-proxy's own proxiers (make bench-compare): for each size of
// a generated workload (N ClusterIP services x M ready endpoints, one
// local endpoint in every tenth service), each proxier runs in a process
// of its own in a network namespace of its own, and the same commands
// time its cold sync, one-endpoint changes, a service added and deleted,
// its memory, the first packet of new connections through it, and a new
// process's first sync over the full table it left (restart adoption).
// It prints the ratios and writes a markdown report and an SVG plot.
//
// With -ipvs it folds in the IPVS backend's measurements, which make
// bench-ipvs takes in a VM (this kind of host's kernel has no IPVS); with
// -from it writes the report of an earlier run's compare.json again
// instead of measuring.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

type size struct{ n, m int }

func (s size) String() string { return fmt.Sprintf("%s x %d", count(s.n), s.m) }

func count(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func parseSizes(s string) ([]size, error) {
	var out []size
	for _, f := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(f), "x")
		n, err1 := strconv.Atoi(a)
		m, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || n < 3 || m < 1 {
			return nil, fmt.Errorf("bad size %q (want NxM)", f)
		}
		out = append(out, size{n, m})
	}
	return out, nil
}

type config struct {
	kproxy, kubeProxy string
	sizes             []size
	bound             time.Duration
	changes           int
	changeBudget      time.Duration
	services          int
	probes            int
	out, readme       string
	log               *os.File
}

func main() {
	var c config
	sizes := flag.String("sizes", "1000x10,10000x10,5000x50,50000x5", "workload sizes, services x endpoints")
	flag.StringVar(&c.kproxy, "kproxy-driver", "", "kproxy's driver binary (internal/testkit/cmd/kproxy-bench)")
	flag.StringVar(&c.kubeProxy, "kubeproxy-driver", "", "kube-proxy's driver binary (bench/cmd/kubeproxy-driver)")
	flag.DurationVar(&c.bound, "bound", 3*time.Minute, "longest wait for one answer of a driver (a sync): past it the proxier is reported as not finishing")
	flag.IntVar(&c.changes, "changes", 200, "one-endpoint changes per proxier and size (fewer past -change-budget)")
	flag.DurationVar(&c.changeBudget, "change-budget", 20*time.Second, "time spent on changes per proxier and size (at least 3 are made)")
	flag.IntVar(&c.services, "services", 10, "services added and deleted per proxier and size")
	flag.IntVar(&c.probes, "probes", 1000, "TCP connections of the data-path probe per proxier and size")
	flag.StringVar(&c.out, "out", "results", "directory of the report (compare.md, compare.svg, compare.json)")
	flag.StringVar(&c.readme, "readme", "", "a README whose bench-compare section is replaced with the report")
	ipvs := flag.String("ipvs", "", "make bench-ipvs's output (results/ipvs.txt): the IPVS backend's measurements in the VM, folded into the report")
	from := flag.String("from", "", "the compare.json of an earlier run: write its report again (with -ipvs folded in) instead of measuring")
	flag.Parse()
	var err error
	if c.sizes, err = parseSizes(*sizes); err != nil {
		fatal(err)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		fatal(err)
	}
	var rep *report
	if *from != "" {
		rep, err = loadReport(*from)
	} else {
		rep, err = c.measureAll()
	}
	if err != nil {
		fatal(err)
	}
	if *ipvs != "" {
		if rep.IPVS, err = readIPVS(*ipvs); err != nil {
			fatal(err)
		}
	}
	if err := rep.write(c.out, c.readme); err != nil {
		fatal(err)
	}
	fmt.Print(rep.markdown())
	if *from != "" {
		return
	}
	for _, r := range rep.Results {
		if r.Err != "" && !r.Bounded {
			fatal(fmt.Errorf("%s %s: %s", r.Proxier.label(), r.size(), r.Err))
		}
	}
}

// measureAll measures every proxier at every size.
func (c config) measureAll() (*report, error) {
	if c.kproxy == "" || c.kubeProxy == "" {
		return nil, fmt.Errorf("-kproxy-driver and -kubeproxy-driver are required")
	}
	var err error
	if c.log, err = os.Create(filepath.Join(c.out, "drivers.log")); err != nil {
		return nil, err
	}
	defer c.log.Close()
	rep := &report{Date: time.Now().UTC().Format("2006-01-02"), Machine: machine(), Config: c.describe()}
	for _, sz := range c.sizes {
		for _, pr := range proxiers {
			fmt.Fprintf(os.Stderr, "%-22s %-10s ", pr.label(), sz)
			r := c.measure(pr, sz)
			fmt.Fprintln(os.Stderr, r.summary())
			rep.Results = append(rep.Results, r)
		}
	}
	return rep, nil
}

// loadReport reads the compare.json of an earlier run.
func loadReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	rep := &report{}
	if err := json.Unmarshal(b, rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

func (c config) describe() string {
	return fmt.Sprintf("bound %s per sync; up to %d one-endpoint changes in %s; %d services added and deleted; %d connections per data-path probe",
		c.bound, c.changes, c.changeBudget, c.services, c.probes)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchcompare:", err)
	os.Exit(1)
}

// machine describes the CPU, its count, the memory and the kernel.
func machine() string {
	cpu, cores := "unknown CPU", 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				cores++
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		f := strings.Fields(string(b))
		if len(f) > 1 {
			if kb, err := strconv.Atoi(f[1]); err == nil {
				mem = fmt.Sprintf(", %d GiB", (kb+1<<19)>>20)
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d x %s%s%s", cores, cpu, mem, kernel)
}
