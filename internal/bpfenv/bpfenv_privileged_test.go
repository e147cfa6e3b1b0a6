//go:build privileged

package bpfenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root")
		}
		t.Skip("needs root")
	}
}

func fsType(t *testing.T, dir string) int64 {
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	return int64(st.Type)
}

func mounted(t *testing.T, dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	return strings.Contains(string(b), " "+dir+" ")
}

// TestNewAndClose: New mounts a cgroup v2 hierarchy and a bpf filesystem
// with private propagation and makes a child cgroup; Close removes all
// three.
func TestNewAndClose(t *testing.T) {
	requireRoot(t)
	e, err := New("kproxy-test")
	require.NoError(t, err)
	assert.Equal(t, int64(unix.CGROUP2_SUPER_MAGIC), fsType(t, e.Root))
	assert.Equal(t, int64(unix.BPF_FS_MAGIC), fsType(t, e.BPFFS))
	assert.Equal(t, e.Root, filepath.Dir(e.Cgroup))
	assert.FileExists(t, filepath.Join(e.Cgroup, "cgroup.procs"))
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, " "+e.Root+" ") || strings.Contains(line, " "+e.BPFFS+" ") {
			assert.NotContains(t, line, "shared:", "mount propagates: %s", line)
		}
	}
	require.NoError(t, e.Close())
	for _, dir := range []string{e.Root, e.BPFFS} {
		assert.False(t, mounted(t, dir), dir)
		assert.NoDirExists(t, dir)
	}
}

// TestReap: what a process that is gone left is removed; what a running
// process holds is not.
func TestReap(t *testing.T) {
	requireRoot(t)
	// A process that is gone: a short-lived child's pid.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	gone := cmd.Process.Pid
	dead := filepath.Join(os.TempDir(), "kproxy-reaptest-"+itoa(gone)+"-1-bpf")
	require.NoError(t, mount(dead, "bpf"))
	live, err := New("kproxy-reaptest")
	require.NoError(t, err)
	defer live.Close()
	assert.NoDirExists(t, dead, "New reaps leftovers")
	assert.True(t, mounted(t, live.BPFFS))
	// A child cgroup of a process that is gone, in the live hierarchy.
	stale := filepath.Join(live.Root, "kproxy-reaptest-"+itoa(gone)+"-9")
	require.NoError(t, os.Mkdir(stale, 0o755))
	removed, err := Reap("kproxy-reaptest")
	require.NoError(t, err)
	assert.Empty(t, removed, "the mounts of this process are not reaped")
	var errs []error
	assert.Equal(t, []string{stale}, reapCgroups("kproxy-reaptest", live.Root, &errs))
	assert.Empty(t, errs)
	assert.DirExists(t, live.Cgroup)
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestEnter: Enter moves this process into the child cgroup, and the
// function it returns moves it back; the cgroup can then be removed.
func TestEnter(t *testing.T) {
	requireRoot(t)
	e, err := New("kproxy-test")
	require.NoError(t, err)
	home, err := e.current()
	require.NoError(t, err)
	require.DirExists(t, home)
	back, err := e.Enter()
	require.NoError(t, err)
	t.Cleanup(func() { _ = back(); e.Close() })
	now, err := e.current()
	require.NoError(t, err)
	assert.Equal(t, e.Cgroup, now)
	procs, err := os.ReadFile(filepath.Join(e.Cgroup, "cgroup.procs"))
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(procs)), itoa(os.Getpid()))
	require.NoError(t, back())
	now, err = e.current()
	require.NoError(t, err)
	assert.Equal(t, home, now)
	require.NoError(t, e.Close())
}
