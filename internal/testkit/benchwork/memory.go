package benchwork

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// KernelMemory returns the kernel's unreclaimable slab, per-CPU and
// vmalloc memory in bytes (SUnreclaim, Percpu and VmallocUsed of
// /proc/meminfo), where BPF maps and programs and nf_tables objects
// live. Read before and after a sync, its difference is what the sync
// made the kernel keep, give or take what the rest of the machine did
// meanwhile.
func KernelMemory() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return kernelMemory(b)
}

func kernelMemory(meminfo []byte) (int64, error) {
	var total int64
	s := bufio.NewScanner(bytes.NewReader(meminfo))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 2 || (f[0] != "SUnreclaim:" && f[0] != "Percpu:" && f[0] != "VmallocUsed:") {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, err
		}
		total += kb << 10
	}
	return total, s.Err()
}

// Heap returns the bytes of live heap objects of the calling process,
// after two collections (the second frees what the first finalized).
func Heap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
