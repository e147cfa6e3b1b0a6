package suite

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	basic    = "[sig-network] Services should serve a basic endpoint from pods [Conformance]"
	sourceIP = "[sig-network] Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]"
	fallback = "[sig-network] Services should fallback to local terminating endpoints when there are no ready endpoints with internalTrafficPolicy=Local"
	rejected = "[sig-network] Services should be rejected when no endpoints exist"
)

func TestReadJUnit(t *testing.T) {
	got, err := readJUnit("testdata/junit.xml")
	require.NoError(t, err)
	want := []Result{
		{Spec: basic, Outcome: Passed, Seconds: "20.1"},
		{Spec: sourceIP, Outcome: Failed, Reason: "[FAILED] source IP 10.0.0.11 is not the pod's 10.244.1.5", Seconds: "61.0"},
		{Spec: fallback, Outcome: Skipped, Reason: "Requires at least 2 nodes (not 1)", Seconds: "0.5"},
		{Spec: rejected, Outcome: Failed, Reason: "A spec timeout occurred", Seconds: "600"},
	}
	if d := cmp.Diff(want, got, cmpopts.IgnoreFields(Result{}, "Log"), cmpopts.IgnoreUnexported(Result{})); d != "" {
		t.Errorf("results (-want +got):\n%s", d)
	}
	assert.Contains(t, got[1].Log, "the spec's output", "a failure's log holds the spec's output")
	assert.Contains(t, got[1].Log, "service.go:1234", "a failure's log holds its location")
}

// writeColumn writes a proxy's results as a run leaves them.
func writeColumn(t *testing.T, dir, proxy string, junit string) {
	t.Helper()
	sub := filepath.Join(dir, proxy)
	require.NoError(t, os.MkdirAll(sub, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sub, JUnit), []byte(junit), 0o644))
	require.NoError(t, WriteMeta(sub, Meta{Proxy: proxy, Suite: "full", Date: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), Seconds: 90, Nodes: 3, Procs: 4}))
}

// junitOf makes a report of specs and their outcomes ("passed", "failed"
// or a skip's reason).
func junitOf(outcomes map[string]string) string {
	var b strings.Builder
	b.WriteString(`<testsuites><testsuite name="Kubernetes e2e suite">`)
	for spec, o := range outcomes {
		name := "[It] " + spec + " [sig-network]"
		switch o {
		case Passed:
			b.WriteString(`<testcase name="` + name + `" status="passed" time="1"></testcase>`)
		case Failed:
			b.WriteString(`<testcase name="` + name + `" status="failed" time="1"><failure message="it broke" type="failed">it broke at x.go:1</failure><system-err>output</system-err></testcase>`)
		default:
			b.WriteString(`<testcase name="` + name + `" status="skipped" time="0"><skipped message="skipped - ` + o + `"></skipped></testcase>`)
		}
	}
	b.WriteString(`</testsuite></testsuites>`)
	return b.String()
}

func TestReportVerdict(t *testing.T) {
	dir := t.TempDir()
	writeColumn(t, dir, "kube-proxy-nftables", junitOf(map[string]string{
		basic: Passed, sourceIP: Passed, fallback: Passed, rejected: Failed,
	}))
	writeColumn(t, dir, "kproxy-nftables", junitOf(map[string]string{
		basic: Passed, sourceIP: Failed, fallback: "Requires at least 2 nodes", rejected: Failed,
	}))
	r, err := WriteReport(dir)
	require.NoError(t, err)
	err = r.Verdict()
	require.Error(t, err)
	msg := err.Error()
	assert.Contains(t, msg, "2 regressions")
	assert.Contains(t, msg, "kproxy-nftables: "+sourceIP+": fails: it broke", "a failure kube-proxy passes")
	assert.Contains(t, msg, "kproxy-nftables: "+fallback+": skipped where kube-proxy ran it")
	assert.NotContains(t, msg, rejected, "both fail: not kproxy's regression")

	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	report := string(md)
	assert.Contains(t, report, "| kube-proxy-nftables | 3 | 1 | 0 | 0 | 0 | 1m30s |")
	assert.Contains(t, report, "| kproxy-nftables | 1 | 2 | 1 | 0 | 2 | 1m30s |")
	assert.Regexp(t, regexp.MustCompile(`\| Services should preserve source pod IP [^|]* \| pass \| \*\*FAIL\*\* \(\[log\]\(kproxy-nftables/failures/\d\d-services-should-preserve-source-pod-ip[a-z-]*\.log\)\) \|`), report)
	assert.Contains(t, report, "*skip* [1]")
	assert.Contains(t, report, "1. Requires at least 2 nodes")

	logs, err := filepath.Glob(filepath.Join(dir, "kproxy-nftables", "failures", "*.log"))
	require.NoError(t, err)
	require.Len(t, logs, 2)
	b, err := os.ReadFile(logs[0])
	require.NoError(t, err)
	assert.Contains(t, string(b), "it broke at x.go:1")

	// The JUnit report is trimmed to the results, and reads back the same.
	again, err := readJUnit(filepath.Join(dir, "kproxy-nftables", JUnit))
	require.NoError(t, err)
	assert.Len(t, again, 4)
	r2, err := WriteReport(dir)
	require.NoError(t, err)
	assert.Equal(t, err, nil)
	assert.EqualError(t, r2.Verdict(), msg, "the report written again from trimmed reports says the same")
}

func TestReportDeclared(t *testing.T) {
	saved := Limits
	t.Cleanup(func() { Limits = saved })
	Limits = []Limit{{Proxy: "kproxy-userspace", Spec: regexp.MustCompile(`preserve source pod IP`), Why: "the proxy connects from the node"}}
	dir := t.TempDir()
	writeColumn(t, dir, "kube-proxy-nftables", junitOf(map[string]string{basic: Passed, sourceIP: Passed}))
	writeColumn(t, dir, "kproxy-userspace", junitOf(map[string]string{basic: Passed, sourceIP: Failed}))
	r, err := WriteReport(dir)
	require.NoError(t, err)
	require.NoError(t, r.Verdict(), "a declared limit is not a regression")
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	require.NoError(t, err)
	assert.Contains(t, string(md), "*declared* [1]")
	assert.Contains(t, string(md), "1. the proxy connects from the node")
	assert.Contains(t, string(md), "| kproxy-userspace | 1 | 1 | 0 | 1 | 0 |")
}

func TestReportWithoutBaseline(t *testing.T) {
	dir := t.TempDir()
	writeColumn(t, dir, "kproxy-nftables", junitOf(map[string]string{basic: Passed, sourceIP: Failed}))
	r, err := WriteReport(dir)
	require.NoError(t, err)
	assert.ErrorContains(t, r.Verdict(), sourceIP, "without kube-proxy's column, every failure counts")
}
