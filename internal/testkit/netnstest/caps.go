//go:build linux

package netnstest

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// WithoutCapabilities runs f on the calling goroutine's thread with caps
// (unix.CAP_NET_ADMIN, ...) dropped from the thread's effective set, and
// raises them again from the permitted set afterwards. Capabilities are
// per thread: the rest of the process keeps them, and so does any thread f
// hands work to (a goroutine, a thread a library moves into another
// namespace). What f shows is what the calling thread checks and does
// itself. It needs root; a failure to raise the capabilities again fails
// the test and ends the thread with it.
func WithoutCapabilities(t testing.TB, f func(), caps ...int) {
	t.Helper()
	Require(t, "root")
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("capget: %v", err)
	}
	saved := data
	for _, c := range caps {
		data[c/32].Effective &^= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("capset: %v", err)
	}
	defer func() {
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			// Still locked: the thread ends with the test's goroutine.
			t.Fatalf("raise the capabilities again: %v", err)
		}
		runtime.UnlockOSThread()
	}()
	f()
}
