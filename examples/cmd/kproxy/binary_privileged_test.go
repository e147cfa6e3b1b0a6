//go:build privileged

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
