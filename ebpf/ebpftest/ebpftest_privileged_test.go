//go:build privileged

package ebpftest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
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

// TestReap: what a process that is gone left is removed, the hooks it
// attached to its cgroups detached; what a running process holds is
// not.
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

	// A crashed run's hook: a program attached through a link to its
	// child cgroup, the link pinned in its bpf filesystem. Reap detaches
	// it, and the kernel frees the link and the program (from a work
	// queue: soon after, not always before Reap returns).
	run := crashedRun(t, itoa(gone), live, 10)
	require.Equal(t, []ebpf.ProgramID{run.prog}, attachedTo(t, run.cgroup), "attached before")
	removed, err = Reap("kproxy-reaptest")
	require.NoError(t, err)
	assert.Contains(t, removed, run.dir)
	assert.NoDirExists(t, run.cgroup)
	assert.Eventually(t, func() bool {
		_, lerr := link.NewFromID(run.link)
		_, perr := ebpf.NewProgramFromID(run.prog)
		return errors.Is(lerr, os.ErrNotExist) && errors.Is(perr, os.ErrNotExist)
	}, 10*time.Second, 10*time.Millisecond, "the link or the program outlived Reap")

	// The same with a process of the crashed run still in its cgroup,
	// which cannot be removed then, and the link still open elsewhere
	// (a process of the run that outlived it holds it): Reap says so, and
	// detaches the hook all the same, by the time it returns; once the
	// process ends, the next Reap removes the cgroup.
	run = crashedRun(t, itoa(gone), live, 20)
	held, err := link.NewFromID(run.link)
	require.NoError(t, err)
	defer held.Close()
	sleeper := exec.Command("sleep", "60")
	require.NoError(t, sleeper.Start())
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	require.NoError(t, os.WriteFile(filepath.Join(run.cgroup, "cgroup.procs"), []byte(itoa(sleeper.Process.Pid)), 0o644))
	_, err = Reap("kproxy-reaptest")
	assert.ErrorContains(t, err, run.dir)
	assert.Empty(t, attachedTo(t, run.cgroup), "the hook outlived Reap")
	require.NoError(t, held.Close())
	assert.Eventually(t, func() bool {
		_, err := link.NewFromID(run.link)
		return errors.Is(err, os.ErrNotExist)
	}, 10*time.Second, 10*time.Millisecond, "the link outlived its last holder")
	require.NoError(t, sleeper.Process.Kill())
	sleeper.Wait()
	var again []error
	assert.Equal(t, []string{run.cgroup}, reapCgroups("kproxy-reaptest", live.Root, &again))
	assert.Empty(t, again)
}

// deadRun is what crashedRun leaves: the run's child cgroup (as the
// live hierarchy shows it, and as its own mount did), and the ids of the link that attaches a
// program to it and of the program.
type deadRun struct {
	cgroup string
	dir    string // the child cgroup under the run's own mount
	link   link.ID
	prog   ebpf.ProgramID
}

// crashedRun leaves what a run of process gone that crashed leaves: a
// cgroup v2 mount with a child cgroup, a bpf filesystem, and a program
// attached to the child cgroup at the connect4 hook through a link
// pinned there; no file descriptor stays open. Names are numbered from
// n.
func crashedRun(t *testing.T, gone string, live *Env, n int) deadRun {
	t.Helper()
	base := filepath.Join(os.TempDir(), "kproxy-reaptest-"+gone+"-")
	mnt := base + itoa(n) + "-cgroup2"
	require.NoError(t, mount(mnt, "cgroup2"))
	child := "kproxy-reaptest-" + gone + "-" + itoa(n+1)
	require.NoError(t, os.Mkdir(filepath.Join(mnt, child), 0o755))
	fs := base + itoa(n+2) + "-bpf"
	require.NoError(t, mount(fs, "bpf"))
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.CGroupSockAddr, AttachType: ebpf.AttachCGroupInet4Connect,
		License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
	require.NoError(t, err)
	defer prog.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: filepath.Join(mnt, child), Attach: ebpf.AttachCGroupInet4Connect, Program: prog})
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, l.Pin(filepath.Join(fs, "link_connect4")))
	li, err := l.Info()
	require.NoError(t, err)
	pi, err := prog.Info()
	require.NoError(t, err)
	id, _ := pi.ID()
	return deadRun{cgroup: filepath.Join(live.Root, child), dir: filepath.Join(mnt, child), link: li.ID, prog: id}
}

// attachedTo lists the programs attached to a cgroup at connect4.
func attachedTo(t *testing.T, cgroup string) []ebpf.ProgramID {
	t.Helper()
	f, err := os.Open(cgroup)
	require.NoError(t, err)
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	require.NoError(t, err)
	var out []ebpf.ProgramID
	for _, p := range res.Programs {
		out = append(out, p.ID)
	}
	return out
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
