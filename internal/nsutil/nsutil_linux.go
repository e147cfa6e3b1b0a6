package nsutil

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs f on a fresh goroutine locked to its OS thread and switched
// into ns. The thread is switched back afterwards; if that fails the
// goroutine exits still locked, so the runtime ends the thread instead of
// reusing it in the wrong namespace. The calling goroutine's thread never
// changes namespace. A panic in f is raised again in the caller. The zero
// handle (an options struct's default) means the caller's own namespace: f
// runs on the calling goroutine; a closed handle is an error. So does a
// handle of the namespace the calling thread is in already: f runs on the
// calling goroutine, locked to that thread, and no thread changes
// namespace (which needs CAP_SYS_ADMIN, even into the namespace a thread
// is in).
func Do(ns netns.NsHandle, f func() error) error {
	if ns == 0 {
		return f()
	}
	if !ns.IsOpen() {
		return errors.New("network namespace handle is closed")
	}
	runtime.LockOSThread()
	if own, err := Own(ns); err == nil && own {
		defer runtime.UnlockOSThread()
		return f()
	}
	runtime.UnlockOSThread()
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter network namespace: %w", err)
		}
		return nil
	}, f)
}

// Own reports whether ns is the network namespace of the calling thread:
// the zero handle and netns.None() stand for it, and a handle is compared
// with it by device and inode. Sockets and /proc/sys files that the
// thread opens are in ns then, with no setns. The answer holds for the
// thread: a caller that acts on it locks its goroutine to the thread
// first (runtime.LockOSThread).
func Own(ns netns.NsHandle) (bool, error) {
	if ns == 0 || ns == netns.None() {
		return true, nil
	}
	cur, err := netns.Get()
	if err != nil {
		return false, fmt.Errorf("open current network namespace: %w", err)
	}
	defer cur.Close()
	return ns.Equal(cur), nil
}

// DoNew runs f on a thread inside a new, unnamed network namespace. The
// namespace disappears once f returns unless f keeps a reference to it (an
// open file, a socket or a bind mount).
func DoNew(f func() error) error {
	return onThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare network namespace: %w", err)
		}
		return nil
	}, f)
}

// result carries the outcome of a function run on a switched thread back
// to the calling goroutine.
type result struct {
	err      error
	panicked bool
	panicVal any
	stack    []byte
}

func onThread(enter func() error, f func() error) error {
	done := make(chan result, 1)
	go func() {
		var res result
		defer func() { done <- res }()
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("open current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// setns and unshare change nothing when they fail.
			runtime.UnlockOSThread()
			res.err = err
			return
		}
		defer func() {
			if err := netns.Set(orig); err != nil {
				res.err = errors.Join(res.err, fmt.Errorf("restore network namespace (thread discarded): %w", err))
				return // still locked: the thread dies with this goroutine
			}
			runtime.UnlockOSThread()
		}()
		returned := false
		defer func() {
			if returned {
				return
			}
			if p := recover(); p != nil {
				res.panicked, res.panicVal, res.stack = true, p, debug.Stack()
			} else {
				res.err = ErrGoexit
			}
		}()
		res.err = f()
		returned = true
	}()
	res := <-done
	if res.panicked {
		panic(fmt.Sprintf("%v\n\n[in network namespace]\n%s", res.panicVal, res.stack))
	}
	return res.err
}
