// Package nsutil runs code inside a network namespace without moving the
// caller's thread: sockets, listeners and /proc/sys files opened by the
// code belong to that namespace and stay there after it returns.
//
// Entering a namespace (setns) needs CAP_SYS_ADMIN, even when the thread
// is in it already. Do enters none when the target is the calling
// thread's own namespace, and Own tells a caller that opens sockets
// itself whether its target is, so that a program that programs its own
// namespace needs no CAP_SYS_ADMIN.
package nsutil

import "errors"

// ErrGoexit reports a function that ended its goroutine with
// runtime.Goexit (for example t.FailNow) instead of returning.
var ErrGoexit = errors.New("function called runtime.Goexit (t.FailNow?) instead of returning")

// ErrNotSupported: network namespaces are Linux's.
var ErrNotSupported = errors.New("network namespaces are not supported on this system")
