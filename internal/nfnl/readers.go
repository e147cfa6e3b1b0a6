//go:build linux

package nfnl

import (
	"time"

	"golang.org/x/sys/unix"
)

// membarrierGlobal is MEMBARRIER_CMD_GLOBAL (linux/membarrier.h).
const membarrierGlobal = 1

// readersFallback is how long AwaitReaders waits where the kernel refuses
// to wait for it.
const readersFallback = 50 * time.Millisecond

// AwaitReaders returns once every packet that was going through
// nf_tables' rules when it was called (in any namespace) has gone through
// them. A packet reads the rules and sets under RCU, and the global
// command of membarrier(2) waits for an RCU grace period, as the kernel
// does before it frees what a commit replaced. Two transactions separated
// by AwaitReaders are never both seen by one packet: a packet that read
// the rules before the first cannot look up a set after the second.
// Where membarrier is refused (a seccomp profile without it, CPUs in
// nohz_full mode) it waits 50 ms instead, far longer than a packet takes
// on a running machine, and reports nothing: the wait is a precaution,
// never a reason to fail.
func AwaitReaders() {
	if awaitGracePeriod() != nil {
		time.Sleep(readersFallback)
	}
}

// awaitGracePeriod waits for an RCU grace period through membarrier(2).
func awaitGracePeriod() error {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierGlobal, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
