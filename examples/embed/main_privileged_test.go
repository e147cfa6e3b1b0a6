//go:build privileged

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// The program the README shows, built and run as an embedder runs it:
// with --once it prints the rules of its service, which the kernel held,
// and leaves nothing behind; without, it holds them until SIGTERM, then
// removes them and exits cleanly.
func TestEmbed(t *testing.T) {
	testutil.RequireRoot(t)
	host := netnstest.NewHost(t, "embed")
	bin := filepath.Join(t.TempDir(), "embed")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	nsPath := filepath.Join(netnstest.RunDir, host.NSName)
	table := func() string {
		out, _ := exec.Command("ip", "netns", "exec", host.NSName, "nft", "list", "tables").CombinedOutput()
		return string(out)
	}

	out, err := exec.Command(bin, "--netns", nsPath, "--once", "10.244.1.2", "10.244.2.3").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "10.96.0.10")
	assert.Contains(t, string(out), "10.244.1.2")
	assert.Contains(t, string(out), "10.244.2.3")
	assert.NotContains(t, table(), "kproxy", "--once left its table")

	cmd := exec.Command(bin, "--netns", nsPath, "10.244.1.2")
	logs := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool {
		out, _ := exec.Command("ip", "netns", "exec", host.NSName, "nft", "list", "table", "inet", "kproxy").CombinedOutput()
		return strings.Contains(string(out), "10.96.0.10") && strings.Contains(string(out), "10.244.1.2")
	}, time.Minute, 100*time.Millisecond, "the service's rules in the namespace; output:\n%s", logs)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "%s", logs)
	assert.NotContains(t, table(), "kproxy", "SIGTERM left the table")
}
