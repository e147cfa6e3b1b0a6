//go:build privileged

package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
)

// webService is a service on a cluster IP and a node port, served by
// the sandbox's backend.
const webService = `services:
  - name: demo/web
    clusterIPs: [10.96.0.10]
    ports:
      - {name: http, port: 80, nodePort: 30080, targetPort: 8080}
    endpoints:
      - addr: 10.100.1.2
`

// readable writes a services file in a directory any user may read, for
// a kproxy that runs as nobody.
func readable(t *testing.T, text string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kproxy-services-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	path := filepath.Join(dir, "services.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// startIn starts the kproxy binary, through argv's first words (setpriv),
// in the sandbox node's namespace, and stops it with SIGINT when the test
// ends; the test fails if it does not exit cleanly then.
func startIn(t *testing.T, sb *sandbox.Sandbox, argv ...string) *bytes.Buffer {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, sandbox.In(sb.Node.NS, cmd.Start))
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			assert.NoError(t, err, "kproxy did not exit cleanly:\n%s", logs.String())
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("kproxy did not stop on SIGINT:\n%s", logs.String())
		}
	})
	return &logs
}

// counter returns the value of the sample of a metric whose line matches
// the labels, as /metrics on addr shows it (0 when absent).
func counter(t *testing.T, sb *sandbox.Sandbox, addr, metric, labels string) float64 {
	t.Helper()
	resp, err := sb.Client.HTTPClient(5 * time.Second).Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(metric+labels) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// TestUserspaceServes: kproxy --backend userspace, left running, serves
// the services to the sandbox's client: holding the cluster IPs on the
// node's loopback, as root; and as nobody without any capability
// (--userspace-hold-addresses=false), a service port at the address
// --userspace-listen-at gives and the node port on the node's address. Its
// per-port counters are on /metrics.
func TestUserspaceServes(t *testing.T) {
	sb := newSandbox(t)
	bin := kproxyBinary(t)
	// A binary and a services file the unprivileged run may read.
	require.NoError(t, os.Chmod(filepath.Dir(bin), 0o755))
	services := readable(t, webService)
	node := sandbox.NodeAddr.String()
	args := func(metrics string, extra ...string) []string {
		return append([]string{bin, "--source", "file", "--file", services, "--node-name", "node", "--node-ips", node,
			"--backend", "userspace", "--metrics-bind-address", metrics, "--healthz-bind-address=", "--bpf-pin-path=",
			"--log-format", "json"}, extra...)
	}
	web := `{family="ipv4",port="http",protocol="tcp",service="demo/web"}`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	backend1 := func(c sandbox.Counts) bool { return c["backend-1"] == 3 }

	t.Run("holding the addresses", func(t *testing.T) {
		metrics := node + ":10249"
		logs := startIn(t, sb, args(metrics)...)
		_, err := sb.Eventually(ctx, "http://10.96.0.10:80/", 3, backend1)
		require.NoError(t, err, "through the cluster IP: %s", logs)
		_, err = sb.Eventually(ctx, "http://"+node+":30080/", 3, backend1)
		require.NoError(t, err, "through the node port: %s", logs)
		assert.GreaterOrEqual(t, counter(t, sb, metrics, "kproxy_userspace_accepted_total", web), 6.0)
		assert.Positive(t, counter(t, sb, metrics, "kproxy_userspace_bytes_total", `{direction="out",family="ipv4",port="http",protocol="tcp",service="demo/web"}`))
		_, lo := in(t, sb, "sh", "-c", "ip address show dev lo | grep -q 10.96.0.10/32")
		assert.True(t, lo, "the cluster IP is not on the loopback")
	})

	t.Run("without privileges", func(t *testing.T) {
		metrics := node + ":10250"
		logs := startIn(t, sb, append([]string{"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
			"--inh-caps", "-all", "--bounding-set", "-all", "--"},
			args(metrics, "--userspace-hold-addresses=false", "--userspace-listen-at", "demo/web:http="+node+":18080")...)...)
		_, err := sb.Eventually(ctx, "http://"+node+":18080/", 3, backend1)
		require.NoError(t, err, "through the listen-at address: %s", logs)
		_, err = sb.Eventually(ctx, "http://"+node+":30080/", 3, backend1)
		require.NoError(t, err, "through the node port: %s", logs)
		assert.GreaterOrEqual(t, counter(t, sb, metrics, "kproxy_userspace_accepted_total", web), 6.0)
		assert.Positive(t, counter(t, sb, metrics, "kproxy_userspace_bytes_total", `{direction="in",family="ipv4",port="http",protocol="tcp",service="demo/web"}`))
		assert.NotContains(t, logs.String(), `"level":"ERROR"`)
	})
}
