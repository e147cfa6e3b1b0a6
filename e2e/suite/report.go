package suite

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/e2e/build"
	"github.com/kproxy-dev/kproxy/e2e/cluster"
)

// ReportFile is the report's name in the results directory.
const ReportFile = "README.md"

// Meta is what a proxy's run records beside its JUnit report.
type Meta struct {
	Proxy   string    `json:"proxy"`
	Suite   string    `json:"suite"`
	Date    time.Time `json:"date"`
	Seconds float64   `json:"seconds"`
	Kernel  string    `json:"kernel"`
	Nodes   int       `json:"nodes"`
	Procs   int       `json:"procs"`
}

// WriteMeta writes the run's Meta in dir.
func WriteMeta(dir string, m Meta) error {
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "meta.json"), append(b, '\n'), 0o644)
}

// KeepLogs copies the logs of the proxy's pods (kproxy's or kube-proxy's,
// in kube-system) from every node into dir/logs/<node>.log.
func KeepLogs(c *cluster.Cluster, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return err
	}
	var errs []error
	for _, n := range c.Nodes {
		pods, _ := filepath.Glob(filepath.Join(n.PodLogs(), "kube-system_k*-proxy-*"))
		more, _ := filepath.Glob(filepath.Join(n.PodLogs(), "kube-system_kproxy-*"))
		var files []string
		for _, p := range append(pods, more...) {
			f, _ := filepath.Glob(filepath.Join(p, "*", "*.log"))
			files = append(files, f...)
		}
		slices.Sort(files)
		out, err := os.Create(filepath.Join(dir, "logs", n.Name+".log"))
		if err != nil {
			return err
		}
		for _, f := range files {
			in, err := os.Open(f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			fmt.Fprintf(out, "=== %s\n", strings.TrimPrefix(f, n.PodLogs()+"/"))
			io.Copy(out, in)
			in.Close()
		}
		errs = append(errs, out.Close())
	}
	return errors.Join(errs...)
}

// column is one proxy's results.
type column struct {
	meta    Meta
	results map[string]Result
	logs    map[string]string // spec -> failure log, relative to the results directory
}

// Report is every proxy's results of one results directory.
type Report struct {
	dir   string
	cols  []*column
	specs []string
}

// WriteReport reads each proxy's JUnit report under dir (dir/<proxy>/),
// keeps each failure's log in dir/<proxy>/failures/, trims the JUnit
// report to the specs that ran (without the output of those that did not
// fail), and writes the report that puts the proxies side by side.
func WriteReport(dir string) (*Report, error) {
	r := &Report{dir: dir}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		col, err := readColumn(dir, e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r.cols = append(r.cols, col)
		for s := range col.results {
			if !seen[s] {
				seen[s] = true
				r.specs = append(r.specs, s)
			}
		}
	}
	if len(r.cols) == 0 {
		return nil, fmt.Errorf("%s: no proxy's results", dir)
	}
	slices.SortFunc(r.cols, func(a, b *column) int { return order(a.meta.Proxy) - order(b.meta.Proxy) })
	slices.Sort(r.specs)
	return r, os.WriteFile(filepath.Join(dir, ReportFile), []byte(r.markdown()), 0o644)
}

// order is a proxy's place among the columns: kube-proxy's mode before
// kproxy's backend of the same dataplane.
func order(proxy string) int {
	for i, p := range columnOrder {
		if p == proxy {
			return i
		}
	}
	return len(columnOrder)
}

var columnOrder = []string{"kube-proxy-nftables", "kproxy-nftables", "kube-proxy-iptables", "kproxy-iptables", "kproxy-ebpf", "kproxy-userspace", "kproxy-kubeadm"}

func readColumn(dir, name string) (*column, error) {
	sub := filepath.Join(dir, name)
	b, err := os.ReadFile(filepath.Join(sub, "meta.json"))
	if err != nil {
		return nil, err
	}
	col := &column{results: map[string]Result{}, logs: map[string]string{}}
	if err := json.Unmarshal(b, &col.meta); err != nil {
		return nil, fmt.Errorf("%s/meta.json: %w", sub, err)
	}
	results, err := readJUnit(filepath.Join(sub, JUnit))
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(filepath.Join(sub, "failures")); err != nil {
		return nil, err
	}
	n := 0
	for _, res := range results {
		col.results[res.Spec] = res
		if res.Outcome != Failed {
			continue
		}
		n++
		if err := os.MkdirAll(filepath.Join(sub, "failures"), 0o755); err != nil {
			return nil, err
		}
		rel := filepath.Join(name, "failures", fmt.Sprintf("%02d-%s.log", n, slug(res.Spec)))
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(res.Spec+"\n\n"+res.Log), 0o644); err != nil {
			return nil, err
		}
		col.logs[res.Spec] = rel
	}
	return col, trimJUnit(filepath.Join(sub, JUnit), results)
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

func slug(spec string) string {
	s := nonWord.ReplaceAllString(strings.ToLower(strings.TrimPrefix(spec, "[sig-network] ")), "-")
	s = strings.Trim(s, "-")
	if len(s) > 80 {
		s = strings.TrimRight(s[:80], "-")
	}
	return s
}

// trimJUnit rewrites a JUnit report with only the results, and the output
// of the failures alone.
func trimJUnit(path string, results []Result) error {
	s := junitSuite{Name: "Kubernetes e2e suite"}
	for _, r := range results {
		c := junitCase{Name: "[It] " + r.Spec, Status: r.Outcome, Time: r.Seconds}
		switch r.Outcome {
		case Skipped:
			c.Skipped = &junitMessage{Message: "skipped - " + r.Reason}
		case Failed:
			c.Failure = &junitFailure{Message: r.message, Type: "failed", Text: r.details}
			c.Err = r.output
		}
		s.Cases = append(s.Cases, c)
	}
	b, err := xml.MarshalIndent(junitSuites{Suites: []junitSuite{s}}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(xml.Header), append(b, '\n')...), 0o644)
}

// baseline is the kube-proxy column a kproxy column is held to: the mode
// of the same dataplane (kubeadm's configuration runs iptables), nftables
// for the backends kube-proxy lacks.
func baseline(proxy string) string {
	if proxy == "kproxy-iptables" || proxy == "kproxy-kubeadm" {
		return "kube-proxy-iptables"
	}
	return "kube-proxy-nftables"
}

func (r *Report) column(proxy string) *column {
	for _, c := range r.cols {
		if c.meta.Proxy == proxy {
			return c
		}
	}
	return nil
}

// regression says why a kproxy result fails the run, or "": a failure
// that its backend does not declare, unless kube-proxy fails it too on
// the same cluster; or a skip where kube-proxy ran it.
func (r *Report) regression(col *column, spec string) string {
	if strings.HasPrefix(col.meta.Proxy, "kube-proxy") {
		return ""
	}
	res, ok := col.results[spec]
	if !ok {
		return ""
	}
	base := r.column(baseline(col.meta.Proxy))
	var bres Result
	if base != nil {
		bres = base.results[spec]
	}
	switch {
	case res.Outcome == Failed && Declared(col.meta.Proxy, spec) != nil:
		return ""
	case res.Outcome == Failed && (base == nil || bres.Outcome == Passed):
		return "fails: " + res.Reason
	case res.Outcome == Skipped && bres.Outcome == Passed:
		return "skipped where kube-proxy ran it: " + res.Reason
	}
	return ""
}

// Verdict returns an error naming every regression of a kproxy column.
func (r *Report) Verdict() error {
	var errs []string
	for _, c := range r.cols {
		for _, s := range r.specs {
			if why := r.regression(c, s); why != "" {
				errs = append(errs, fmt.Sprintf("%s: %s: %s", c.meta.Proxy, s, why))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d regressions against kube-proxy:\n  %s", len(errs), strings.Join(errs, "\n  "))
	}
	return nil
}

func (r *Report) markdown() string {
	var b strings.Builder
	first := r.cols[0].meta
	fmt.Fprintf(&b, "# Kubernetes' e2e tests of services: kproxy and kube-proxy side by side\n\n")
	fmt.Fprintf(&b, "Written by `make test-e2e` (suite %q) on %s, Linux %s: Kubernetes %s's own `e2e.test`, "+
		"%d worker nodes, %d ginkgo processes, each proxy in a cluster of its own (e2e/README.md). "+
		"A kproxy column is held to kube-proxy's of the same dataplane (nftables for ebpf and userspace).\n\n",
		first.Suite, first.Date.Format("2006-01-02"), first.Kernel, build.KubernetesVersion, first.Nodes, first.Procs)
	b.WriteString("| proxy | passed | failed | skipped | declared limits | regressions | time |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.cols {
		var n [5]int
		for _, s := range r.specs {
			res, ok := c.results[s]
			if !ok {
				continue
			}
			switch res.Outcome {
			case Passed:
				n[0]++
			case Failed:
				n[1]++
				if Declared(c.meta.Proxy, s) != nil {
					n[3]++
				}
			case Skipped:
				n[2]++
			}
			if r.regression(c, s) != "" {
				n[4]++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s |\n", c.meta.Proxy, n[0], n[1], n[2], n[3], n[4], (time.Duration(c.meta.Seconds) * time.Second).String())
	}
	b.WriteString("\nEach cell: **pass**, **FAIL** (with its log), *skip* (the test's own reason, below), " +
		"*declared* (a limit the backend declares, below), or blank (not run).\n\n")
	b.WriteString("| test |")
	for _, c := range r.cols {
		fmt.Fprintf(&b, " %s |", c.meta.Proxy)
	}
	b.WriteString("\n|---|")
	for range r.cols {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	var reasons []string
	note := func(reason string) int {
		if i := slices.Index(reasons, reason); i >= 0 {
			return i + 1
		}
		reasons = append(reasons, reason)
		return len(reasons)
	}
	for _, s := range r.specs {
		fmt.Fprintf(&b, "| %s |", strings.ReplaceAll(strings.TrimPrefix(s, "[sig-network] "), "|", `\|`))
		for _, c := range r.cols {
			res, ok := c.results[s]
			cell := ""
			switch {
			case !ok:
			case res.Outcome == Passed:
				cell = "pass"
			case res.Outcome == Skipped:
				cell = fmt.Sprintf("*skip* [%d]", note(res.Reason))
			case Declared(c.meta.Proxy, s) != nil:
				cell = fmt.Sprintf("*declared* [%d] ([log](%s))", note(Declared(c.meta.Proxy, s).Why), filepath.ToSlash(c.logs[s]))
			default:
				cell = fmt.Sprintf("**FAIL** ([log](%s))", filepath.ToSlash(c.logs[s]))
			}
			fmt.Fprintf(&b, " %s |", cell)
		}
		b.WriteString("\n")
	}
	if len(reasons) > 0 {
		b.WriteString("\nReasons:\n\n")
		for i, why := range reasons {
			fmt.Fprintf(&b, "%d. %s\n", i+1, why)
		}
	}
	if err := r.Verdict(); err != nil {
		fmt.Fprintf(&b, "\n## Regressions\n\n```\n%v\n```\n", err)
	} else {
		b.WriteString("\nNo regression: every test kube-proxy passes, kproxy passes, but for the limits its backends declare.\n")
	}
	b.WriteString("\nWhat cannot run here at all, in any column: `[Serial]` and `[Disruptive]` tests (they restart or reconfigure " +
		"the cluster's components: kube-proxy's restart test needs it as a static pod of kube-system), `[Flaky]` ones, " +
		"`[Feature:...]` ones (dual stack, IPv6, cloud load balancers), and SCTP (this kernel has no SCTP). " +
		"The ipvs backend needs the ip_vs modules, which this kernel lacks: the conformance kit proves it in a VM (`make test-vm`).\n")
	return b.String()
}
