package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netns"
)

// netnsDir is where named network namespaces are bind-mounted (as by
// vishvananda/netns and iproute2), so that `ip netns exec NAME` reaches them.
const netnsDir = "/run/netns"

// Prefix starts the name of every namespace a sandbox creates. The next
// field is the creating process's pid, which Reap uses to find leftovers.
const Prefix = "kpxsb-"

// createNamed creates a named network namespace and returns a handle to it.
// The namespace is entered on a locked thread of its own that is never
// unlocked, so the thread ends with its goroutine and no other goroutine
// ever runs in the new namespace by accident; the caller's namespace is
// never changed.
func createNamed(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread has left the caller's namespace.
		h, err := netns.NewNamed(name)
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		return netns.None(), fmt.Errorf("create network namespace %s: %w", name, r.err)
	}
	return r.h, nil
}

// In runs f on a locked OS thread inside the network namespace ns, and
// returns its error. Sockets that f opens stay in ns after In returns, so
// listeners and connections made in f can be used from any goroutine. The
// calling goroutine's namespace never changes: the thread that entered ns
// is discarded afterwards.
func In(ns netns.NsHandle, f func() error) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread ends with the goroutine, so it never
		// goes back into the pool while inside ns.
		if err := netns.Set(ns); err != nil {
			ch <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ch <- f()
	}()
	return <-ch
}

// Reap deletes the namespaces that sandboxes of processes no longer
// running left behind, as after a crash. It returns the names it deleted.
func Reap() ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reap sandboxes: %w", err)
	}
	var gone []string
	var errs []error
	for _, e := range entries {
		pid, ok := ownerPid(e.Name())
		if !ok || alive(pid) {
			continue
		}
		if err := netns.DeleteNamed(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", e.Name(), err))
			continue
		}
		gone = append(gone, e.Name())
	}
	return gone, errors.Join(errs...)
}

// ownerPid parses the pid out of a sandbox namespace name.
func ownerPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return 0, false
	}
	field, _, _ := strings.Cut(rest, "-")
	pid, err := strconv.Atoi(field)
	return pid, err == nil && pid > 0
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// deleteNamed removes a named namespace; a namespace already gone is not
// an error.
func deleteNamed(name string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := netns.DeleteNamed(name); err != nil {
		return fmt.Errorf("delete network namespace %s: %w", name, err)
	}
	return nil
}
