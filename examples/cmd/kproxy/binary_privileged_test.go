//go:build privileged

package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
)

var built struct {
	once sync.Once
	path string
	err  error
	dir  string
}

// kproxyBinary builds the kproxy binary once for the package's tests, as
// make kproxy does: static, with its version and commit set at link time.
func kproxyBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "kproxy-bin-")
		if built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "kproxy")
		cmd := exec.Command("go", "build", "-trimpath", "-o", built.path,
			"-ldflags", "-s -w -X main.version=v0.0.0-test -X main.commit=0123abc", ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		var out []byte
		if out, built.err = cmd.CombinedOutput(); built.err != nil {
			built.err = &buildError{err: built.err, out: string(out)}
		}
	})
	require.NoError(t, built.err)
	return built.path
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

// The binary prints the version and commit it was linked with, and the Go
// version and platform.
func TestBinaryVersion(t *testing.T) {
	out, err := exec.Command(kproxyBinary(t), "--version").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Equal(t, "kproxy v0.0.0-test (commit 0123abc, "+runtime.Version()+", "+runtime.GOOS+"/"+runtime.GOARCH+")\n", string(out))
}

// The systemd unit passes systemd-analyze verify (with the binary where
// the unit runs it, and systemd's own units beside it), and its command
// line is one kproxy accepts.
func TestSystemdUnit(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testutil.SkipOrFail(t, "systemd-analyze not installed (Debian's systemd package; hack/deps.sh installs it)")
	}
	unit, err := os.ReadFile("../../../deploy/systemd/kproxy.service")
	require.NoError(t, err)
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	bin, err := os.ReadFile(kproxyBinary(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/local/bin/kproxy"), bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/systemd/system/kproxy.service"), unit, 0o644))
	// The targets and mounts the unit depends on, from the host's systemd.
	out, err := exec.Command("cp", "-r", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput()
	require.NoError(t, err, string(out))

	out, err = exec.Command(analyze, "verify", "--root="+root, "/etc/systemd/system/kproxy.service").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Empty(t, string(out), "systemd-analyze verify has remarks")

	// ExecStart, with the services file here and nothing in $KPROXY_ARGS,
	// as a dry run.
	var argv []string
	for line := range strings.SplitSeq(string(unit), "\n") {
		if rest, ok := strings.CutPrefix(line, "ExecStart="); ok {
			argv = strings.Fields(rest)
		}
	}
	require.Equal(t, "/usr/local/bin/kproxy", argv[0])
	services := servicesFile(t)
	var args []string
	for _, a := range argv[1:] {
		switch a {
		case "$KPROXY_ARGS":
		case "/etc/kproxy/services.yaml":
			args = append(args, services)
		default:
			args = append(args, a)
		}
	}
	code, stdout, logs := run(t, append(args, "--dry-run", "--once")...)
	require.Equal(t, 0, code, logs)
	has(t, stdout, "10.96.0.10", "the unit's command line")
}

// TestBinaryAnswersWhy: the running binary (nftables, in a sandbox's
// namespace) answers /configz, /proxyMode,
// /state and /explain on its metrics address over HTTP, and `kproxy
// explain` asks it, with the answer the dumped state gives offline.
func TestBinaryAnswersWhy(t *testing.T) {
	bin := kproxyBinary(t)
	sb := newSandbox(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--source", "file", "--file", servicesFile(t), "--netns", sb.Node.NSName,
		"--node-name", "node-1", "--node-ips", "10.100.0.1", "--cluster-cidrs", "10.244.0.0/16",
		"--metrics-bind-address", addr, "--healthz-bind-address", "", "--bpf-pin-path", "")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &logs
	require.NoError(t, cmd.Start())
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool {
		code, _ := get("/explain?from=10.244.1.5&to=10.96.0.10:80")
		return code == http.StatusOK
	}, time.Minute, 50*time.Millisecond, "no answer after the first sync; logs:\n%s", &logs)

	code, body := get("/proxyMode")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "nftables", body)
	code, body = get("/configz")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"NodeIPs": "10.100.0.1"`)
	code, body = get("/state")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"name": "demo/web"`)

	ask := func(args ...string) string {
		out, err := exec.Command(bin, args...).CombinedOutput()
		require.NoError(t, err, string(out))
		return string(out)
	}
	flow := []string{"--from", "10.244.1.5", "--to", "10.96.0.10:80/tcp"}
	online := ask(append([]string{"explain", "--server", addr}, flow...)...)
	assert.Regexp(t, `frontend +cluster IP 10\.96\.0\.10:80 of demo/web:http/ipv4`, online)
	assert.Regexp(t, `origin +pod: `, online)
	// The running proxy adds the kernel's word: nftables reads back
	// what serves the flow.
	assert.Regexp(t, `kernel +nftables agrees with the explanation`, online)
	assert.Regexp(t, `read +table inet kproxy`, online)
	assert.Contains(t, ask(append([]string{"explain", "--server", addr, "--json"}, flow...)...), `"kernel": {`)
	// kproxy trace follows the next packet of a flow through the rules:
	// the client's requests to the web service, until one is traced.
	type traced struct {
		out string
		err error
	}
	done := make(chan traced, 1)
	go func() {
		out, err := exec.Command(bin, "trace", "--server", addr, "--from", sandbox.ClientAddr.String(),
			"--to", "10.96.0.10:80/tcp", "--timeout", "30s").CombinedOutput()
		done <- traced{string(out), err}
	}()
	client := sb.Client.HTTPClient(time.Second)
	var tr traced
	require.Eventually(t, func() bool {
		if resp, err := client.Get("http://10.96.0.10/"); err == nil {
			resp.Body.Close()
		}
		select {
		case tr = <-done:
			return true
		default:
			return false
		}
	}, 40*time.Second, 100*time.Millisecond, "no trace")
	require.NoError(t, tr.err, tr.out)
	t.Logf("kproxy explain:\n%s\nkproxy trace:\n%s", online, tr.out)
	assert.Regexp(t, `inet kproxy services: ip daddr \. meta l4proto \. th dport @verdicts4/[a-z/-]+ goto verdicts4/[a-z/-]+ -> goto verdicts4/`, tr.out)
	assert.Regexp(t, `inet kproxy cluster4: .* map @endpoints4 -> accept`, tr.out)

	decided, _, found := strings.Cut(online, "\nkernel ")
	require.True(t, found, online)
	path := filepath.Join(t.TempDir(), "state.json")
	require.NoError(t, os.WriteFile(path, []byte(ask("state", "--server", addr, "--json")), 0o600))
	assert.Equal(t, decided+"\n", ask(append([]string{"explain", "--state", path}, flow...)...))
}
