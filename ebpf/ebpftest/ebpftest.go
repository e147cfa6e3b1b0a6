//go:build linux

// Package ebpftest gives a test, a benchmark or a sandbox of the ebpf
// backend what it attaches to, without touching the host's own: a private
// mount of the cgroup v2 hierarchy with a child cgroup of its own, and a
// private bpf filesystem to pin in. It never attaches anything to a cgroup
// it did not make, and never uses the host's /sys/fs/bpf. kproxy's own
// tests and its sandbox demo use it; so may an agent's:
//
//	env, err := ebpftest.New("myagent-test")
//	if err != nil {
//		t.Fatal(err)
//	}
//	defer env.Close()
//	p, err := ebpf.New(ebpf.Options{Cgroup: env.Cgroup, PinPath: filepath.Join(env.BPFFS, "kproxy"), ...})
//
// The processes whose sockets the hooks balance must run in env.Cgroup:
// start them there, or move the test's own process in with Env.Enter.
//
// Everything is named "<prefix>-<pid>-<n>": the mount points in the
// temporary directory ("...-cgroup2", "...-bpf") and the child cgroups,
// made right under the hierarchy's root. Env.Close removes them; New
// first removes those of earlier processes that are no longer running (a
// crashed run), recognised by the prefix and the pid, and never touches
// those of running processes or anything else.
//
// The mounts are made private (no propagation), so that they appear in
// no other mount namespace. A child cgroup can only be removed once no
// process is in it: end the processes started in it first, and move a
// process that entered it (Env.Enter, for a benchmark or a demo whose own
// sockets meet the hooks) back.
package ebpftest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Env is a private cgroup v2 mount with a child cgroup, and a private bpf
// filesystem.
type Env struct {
	// Root is the mount point of the cgroup v2 hierarchy.
	Root string
	// Cgroup is the child cgroup made for the caller, under Root.
	Cgroup string
	// BPFFS is the mount point of the bpf filesystem.
	BPFFS string

	prefix string
	extra  []string // more child cgroups, from NewCgroup
}

var seq atomic.Uint64

func name(prefix string, pid int) string {
	return fmt.Sprintf("%s-%d-%d", prefix, pid, seq.Add(1))
}

// New mounts the cgroup v2 hierarchy and a bpf filesystem in the
// temporary directory, makes a child cgroup, and returns them. It needs
// root (CAP_SYS_ADMIN). prefix names everything it makes.
func New(prefix string) (*Env, error) {
	if _, err := Reap(prefix); err != nil {
		return nil, err
	}
	base := filepath.Join(os.TempDir(), name(prefix, os.Getpid()))
	e := &Env{Root: base + "-cgroup2", BPFFS: base + "-bpf", prefix: prefix}
	if err := mount(e.Root, "cgroup2"); err != nil {
		return nil, fmt.Errorf("ebpftest: cgroup2: %w", err)
	}
	var errs []error
	reapCgroups(prefix, e.Root, &errs)
	if err := mount(e.BPFFS, "bpf"); err != nil {
		e.Close()
		return nil, fmt.Errorf("ebpftest: bpffs: %w", err)
	}
	cg, err := e.NewCgroup()
	if err != nil {
		e.Close()
		return nil, err
	}
	e.Cgroup = cg
	return e, nil
}

// NewCgroup makes another child cgroup under Root, removed by Close.
func (e *Env) NewCgroup() (string, error) {
	dir := filepath.Join(e.Root, name(e.prefix, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("ebpftest: child cgroup: %w", err)
	}
	e.extra = append(e.extra, dir)
	return dir, nil
}

// Enter moves the calling process (every thread of it) into Cgroup, so
// that the sockets it makes meet what is attached there, and returns the
// function that moves it back to the cgroup it was in. A benchmark or a
// demo that measures the hooks from its own sockets calls it; call back
// before Close, which cannot remove a cgroup a process is in.
func (e *Env) Enter() (back func() error, err error) {
	home, err := e.current()
	if err != nil {
		return nil, err
	}
	if err := moveTo(e.Cgroup); err != nil {
		return nil, err
	}
	return func() error { return moveTo(home) }, nil
}

// current returns the directory under Root of the calling process's
// cgroup.
func (e *Env) current() (string, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("ebpftest: %w", err)
	}
	for _, line := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(e.Root, p), nil
		}
	}
	return "", fmt.Errorf("ebpftest: /proc/self/cgroup names no cgroup v2 cgroup")
}

func moveTo(dir string) error {
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0o644); err != nil {
		return fmt.Errorf("ebpftest: move into cgroup %s: %w", dir, err)
	}
	return nil
}

func mount(dir, fstype string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(fstype, dir, fstype, 0, ""); err != nil {
		os.Remove(dir)
		return fmt.Errorf("mount %s on %s: %w", fstype, dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		unmount(dir)
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

func unmount(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// rmCgroup removes a child cgroup, waiting a little for processes that
// just ended to leave it.
func rmCgroup(dir string) error {
	var err error
	for range 50 {
		if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}

// Close removes the child cgroups, then unmounts both filesystems
// (unmounting the bpf filesystem drops what is pinned in it) and removes
// the mount points.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.extra) - 1; i >= 0; i-- {
		errs = append(errs, rmCgroup(e.extra[i]))
	}
	e.extra = nil
	for _, dir := range []string{e.Root, e.BPFFS} {
		if dir != "" {
			errs = append(errs, unmount(dir))
		}
	}
	return errors.Join(errs...)
}

// alive reports whether a process runs.
func alive(pid int) bool {
	return pid == os.Getpid() || unix.Kill(pid, 0) == nil || errors.Is(unix.Kill(pid, 0), unix.EPERM)
}

// pidOf returns the pid in a name "<prefix>-<pid>-...".
func pidOf(prefix, n string) (int, bool) {
	rest, ok := strings.CutPrefix(n, prefix+"-")
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

// Reap removes what processes that are gone left with this prefix: their
// mount points in the temporary directory (their child cgroups first) and
// returns what it removed. Each link pinned in a bpf filesystem is
// detached from where it is attached before the filesystem goes, so that
// its program has left the cgroup when Reap returns, even a cgroup that
// cannot be removed yet because a process is still in it (an error says
// which). Unmounting drops the pins; the kernel frees a link whose last
// reference goes later, from a work queue, and only then would it detach.
func Reap(prefix string) ([]string, error) {
	ents, err := os.ReadDir(os.TempDir())
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, ent := range ents {
		pid, ok := pidOf(prefix, ent.Name())
		if !ok || alive(pid) {
			continue
		}
		dir := filepath.Join(os.TempDir(), ent.Name())
		if strings.HasSuffix(ent.Name(), "-cgroup2") {
			removed = append(removed, reapCgroups(prefix, dir, &errs)...)
		}
		if strings.HasSuffix(ent.Name(), "-bpf") {
			if err := detachPinnedLinks(dir); err != nil {
				errs = append(errs, err)
			}
		}
		if err := unmount(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// detachPinnedLinks detaches every link pinned under a bpf filesystem
// (BPF_LINK_DETACH); other pins are left to the unmount.
func detachPinnedLinks(root string) error {
	var errs []error
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			return nil // not a link
		}
		defer l.Close()
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", path, err))
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// reapCgroups removes the child cgroups under a cgroup v2 mount whose
// names carry the prefix and the pid of a process that is gone.
func reapCgroups(prefix, root string, errs *[]error) []string {
	var out []string
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	for _, ent := range ents {
		pid, ok := pidOf(prefix, ent.Name())
		if !ok || !ent.IsDir() || alive(pid) {
			continue
		}
		dir := filepath.Join(root, ent.Name())
		if err := rmCgroup(dir); err != nil {
			*errs = append(*errs, err)
			continue
		}
		out = append(out, dir)
	}
	return out
}
