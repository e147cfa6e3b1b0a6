package conntrack

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNamespace runs f on a fresh goroutine locked to its OS thread and
// switched into ns, so that sockets f creates belong to ns. The caller's
// thread never changes namespace. The thread is switched back afterwards;
// if that fails the goroutine exits still locked and the runtime
// terminates the thread rather than reuse it in the wrong namespace.
func inNamespace(ns netns.NsHandle, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("restore network namespace: %w", err))
			return // still locked: the thread dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
