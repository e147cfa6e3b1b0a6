package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupFS is where the host mounts its cgroup hierarchies: a directory
// per cgroup v1 hierarchy, and unified, the cgroup v2 hierarchy, which on
// a hybrid host has no controllers and only tracks processes.
const CgroupFS = "/sys/fs/cgroup"

// CgroupRoot is the child cgroup that holds every process of a cluster,
// in every hierarchy: CgroupRoot/control-plane, and CgroupRoot/<node>
// for each node, which the node's kubelet takes as its cgroupRoot and
// creates its pods' cgroups under.
const CgroupRoot = "kproxy-e2e"

// hierarchies returns the directories of the host's cgroup hierarchies
// (the v1 ones and the v2 one), read from the mount table.
func hierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	var dirs []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		if filepath.Dir(f[1]) == CgroupFS {
			dirs = append(dirs, f[1])
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy is mounted under %s", CgroupFS)
	}
	return dirs, nil
}

// unified returns the cgroup v2 hierarchy's directory, or "".
func unified(dirs []string) string {
	for _, d := range dirs {
		var st syscall.Statfs_t
		if syscall.Statfs(d, &st) == nil && st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
			return d
		}
	}
	return ""
}

// makeCgroup creates CgroupRoot/name in every hierarchy. A new cpuset
// cgroup of a v1 hierarchy starts with no CPUs and no memory nodes, so
// they are copied from its parent.
func makeCgroup(dirs []string, name string) error {
	for _, h := range dirs {
		parent := h
		for _, part := range []string{CgroupRoot, name} {
			dir := filepath.Join(parent, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
			if filepath.Base(h) == "cpuset" {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, err := os.ReadFile(filepath.Join(parent, f))
					if err != nil {
						return fmt.Errorf("cgroup %s: %w", dir, err)
					}
					if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
						return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
					}
				}
			}
			parent = dir
		}
	}
	return nil
}

// cgroupProcs returns the pids in the tree under dir.
func cgroupProcs(dir string) []int {
	var pids []int
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// killCgroups sends SIGKILL to every process in the trees of CgroupRoot
// (they are the cluster's: started into them by this package, or by the
// kubelets and runtimes it started) until none is left, and then removes
// the trees, deepest first.
func killCgroups(dirs []string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left []int
		for _, h := range dirs {
			left = append(left, cgroupProcs(filepath.Join(h, CgroupRoot))...)
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v stay in the cluster's cgroups after SIGKILL", left)
		}
		for _, pid := range left {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []error
	for _, h := range dirs {
		errs = append(errs, removeTree(filepath.Join(h, CgroupRoot)))
	}
	return errors.Join(errs...)
}

// removeTree removes a cgroup directory and its children, deepest first,
// waiting a little for cgroups whose last process just died.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeTree(filepath.Join(dir, e.Name())))
		}
	}
	for i := 0; ; i++ {
		err = os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			break
		}
		if !errors.Is(err, syscall.EBUSY) || i == 100 {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.Join(errs...)
}

// joinScript is the start of a shell command line that moves the shell
// into the cgroup CgroupRoot/name of every hierarchy, before it executes
// the program: so the program, and all it starts, is in them from its
// first instruction.
func joinScript(dirs []string, name string) string {
	var b strings.Builder
	for _, h := range dirs {
		fmt.Fprintf(&b, "echo $$ > %s && ", filepath.Join(h, CgroupRoot, name, "cgroup.procs"))
	}
	b.WriteString(`exec "$@"`)
	return b.String()
}
