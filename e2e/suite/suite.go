// Package suite says which of Kubernetes' own end-to-end tests the
// real-cluster run takes, runs them with ginkgo against a cluster, reads
// their JUnit reports and writes the report that puts every proxy's
// result side by side.
package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/e2e/cluster"
)

// Suite is a selection of the e2e tests.
type Suite struct {
	// Name is full or smoke.
	Name string
	// Focus and Skip are ginkgo's regular expressions over the specs'
	// full texts.
	Focus, Skip string
	// Procs is the number of ginkgo's parallel processes.
	Procs int
	// Timeout bounds the whole run.
	Timeout time.Duration
}

// skip leaves out what cannot run here, in any proxy's column:
//   - [Serial] and [Disruptive]: they restart or reconfigure the cluster's
//     components (kube-proxy's restart test needs it to be a static pod
//     of kube-system; the API server's, a restartable one);
//   - [Flaky];
//   - [Feature:...]: features a default cluster has not (dual stack, IPv6,
//     load-balancer providers);
//   - SCTP: this machine's kernel has no SCTP.
const skip = `\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:|SCTP`

// Full is every test of the services' path: [sig-network] Services, every
// sig-network [Conformance] test, the Networking tests (among them
// "Granular Checks: Services"), EndpointSlice, Service endpoints latency,
// Conntrack, HostPort and DNS (through the kube-dns service).
var Full = Suite{
	Name: "full",
	Focus: `\[sig-network\] (Services|Networking|EndpointSlice|EndpointSliceMirroring|Service endpoints latency|Conntrack|HostPort|DNS) |` +
		`\[sig-network\].*\[Conformance\]`,
	Skip: skip, Procs: 4, Timeout: 3 * time.Hour,
}

// Smoke is the handful of Services tests that make test runs: a cluster
// IP, a node port, session affinity, the Local policies, a service
// without endpoints, and the labels that take a service from the proxy.
var Smoke = Suite{
	Name: "smoke",
	Focus: `\[sig-network\] Services (` + strings.Join([]string{
		`should serve a basic endpoint from pods`,
		`should be able to create a functioning NodePort service`,
		`should have session affinity work for service with type clusterIP`,
		`should respect internalTrafficPolicy=Local Pod to Pod`,
		`should support externalTrafficPolicy=Local for type=NodePort`,
		`should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes`,
		`should be rejected when no endpoints exist`,
		`should implement service.kubernetes.io/headless`,
		`should implement service.kubernetes.io/service-proxy-name`,
	}, "|") + `)`,
	Skip: skip, Procs: 4, Timeout: 30 * time.Minute,
}

// Lookup returns the suite of a name.
func Lookup(name string) (Suite, error) {
	for _, s := range []Suite{Full, Smoke} {
		if s.Name == name {
			return s, nil
		}
	}
	return Suite{}, fmt.Errorf("suite %q: want full or smoke", name)
}

// Runner is what a run needs besides the cluster.
type Runner struct {
	// Ginkgo and E2ETest are the binaries of the release.
	Ginkgo, E2ETest string
	// Out receives ginkgo's output.
	Out *os.File
}

// JUnit is the name of the report a run writes in its directory.
const JUnit = "junit.xml"

// Run runs the suite against the cluster from the control plane's
// namespace, as a test runner outside the cluster would, and writes its
// JUnit report in dir. A failed test is not an error: the report says it.
func (r Runner) Run(ctx context.Context, s Suite, c *cluster.Cluster, dir string, dryRun bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	args := []string{
		"--procs=" + strconv.Itoa(s.Procs), "--timeout=" + s.Timeout.String(),
		"--focus=" + s.Focus, "--skip=" + s.Skip,
		"--output-dir=" + dir, "--junit-report=" + JUnit,
		"--keep-going", "--silence-skips", "--no-color", "--poll-progress-after=5m",
	}
	if dryRun {
		args = append(args, "--dry-run", "-v")
	}
	args = append(args, r.E2ETest, "--",
		"--kubeconfig="+c.Kubeconfig, "--provider=local", "--kubectl-path="+c.KubectlPath(),
		"--num-nodes="+strconv.Itoa(len(c.Nodes)),
		"--dump-logs-on-failure=false",
	)
	cmd := c.Command(ctx, r.Ginkgo, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = r.Out, r.Out
	err := cmd.Run()
	if _, statErr := os.Stat(filepath.Join(dir, JUnit)); statErr != nil {
		return fmt.Errorf("ginkgo wrote no report: %v", err)
	}
	return nil
}
