//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"golang.org/x/sys/unix"
)

const (
	// RunDir is where named network namespaces are bind mounted, as
	// iproute2 does, so that `ip netns exec NAME` reaches them.
	RunDir = "/run/netns"
	// Prefix starts the name of every namespace the kit creates:
	// "kpt-<pid>-<token>-<host>".
	Prefix = "kpt-"
	// lockFile serialises the one-time mount setup of RunDir between
	// test processes that run at the same time.
	lockFile = "/run/kproxy-netnstest.lock"
)

// inNamespace runs f on a thread inside ns (see nsutil.Do).
func inNamespace(ns netns.NsHandle, f func() error) error { return nsutil.Do(ns, f) }

// inNewNamespace runs f on a thread inside a new, unnamed network
// namespace (see nsutil.DoNew).
func inNewNamespace(f func() error) error { return nsutil.DoNew(f) }

// prepareRunDir makes sure RunDir exists and is a shared mount point, as
// `ip netns add` does on first use. Were it a plain directory, a later
// `ip netns add` would bind mount it over itself and hide the namespace
// mounts already inside.
func prepareRunDir() error {
	if err := os.MkdirAll(RunDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", RunDir, err)
	}
	lock, err := os.OpenFile(lockFile, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", lockFile, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lockFile, err)
	}
	err = unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(RunDir, RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount point: %w", RunDir, err)
	}
	return nil
}

// newToken returns a random token that makes namespace names unique
// within this process.
func newToken() string { return strconv.FormatUint(uint64(rand.Uint32()), 36) }

// nsName returns the name of a namespace of this process.
func nsName(token, host string) string {
	return fmt.Sprintf("%s%d-%s-%s", Prefix, os.Getpid(), token, host)
}

// createNamed creates a network namespace bind mounted at RunDir/name and
// returns a handle to it. Nothing is left behind when it fails.
func createNamed(name string) (netns.NsHandle, error) {
	path := filepath.Join(RunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return netns.None(), fmt.Errorf("create namespace %s: %w", name, err)
	}
	f.Close()
	err = inNewNamespace(func() error {
		return unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
	})
	if err != nil {
		os.Remove(path)
		return netns.None(), fmt.Errorf("create namespace %s: bind mount: %w", name, err)
	}
	h, err := netns.GetFromPath(path)
	if err != nil {
		deleteNamed(name)
		return netns.None(), fmt.Errorf("create namespace %s: open: %w", name, err)
	}
	return h, nil
}

// deleteNamed unmounts and removes a named namespace. The namespace itself
// is freed by the kernel once nothing else refers to it.
func deleteNamed(name string) error {
	path := filepath.Join(RunDir, name)
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete namespace %s: unmount: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete namespace %s: %w", name, err)
	}
	return nil
}

// leftoverPID parses the creating pid out of a namespace name made by the
// kit; ok is false for other names.
func leftoverPID(name string) (pid int, ok bool) {
	rest, found := strings.CutPrefix(name, Prefix)
	if !found {
		return 0, false
	}
	num, _, found := strings.Cut(rest, "-")
	if !found {
		return 0, false
	}
	pid, err := strconv.Atoi(num)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// alive reports whether a process with the pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// reap deletes the namespaces left behind by test processes that are no
// longer running, and returns their names.
func reap() ([]string, error) {
	entries, err := os.ReadDir(RunDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("reap: %w", err)
	}
	var reaped []string
	var errs []error
	for _, e := range entries {
		pid, ok := leftoverPID(e.Name())
		if !ok || pid == os.Getpid() || alive(pid) {
			continue
		}
		if err := deleteNamed(e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, e.Name())
	}
	return reaped, errors.Join(errs...)
}
