//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork/benchlb"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

type proxier interface {
	servicelb.Proxier
	Close() error
}

// driver holds one backend's proxier over the workload in the caller's
// network namespace.
type driver struct {
	backend string
	n, m    int
	svcs    []benchwork.Service
	st      *servicelb.State
	// b is kept across changes, as a servicelb.Runner keeps its Builder:
	// a change then costs what it changes, not a walk of every service.
	b       *servicelb.Builder
	p       proxier
	digest  string
	changes int // one-endpoint changes made so far
	added   int // services added so far
	cpuProf *os.File
	syncCPU float64
}

func newProxier(backend string, ns netns.NsHandle) (proxier, error) {
	switch backend {
	case "nftables":
		return nftables.New(nftables.Options{NetNS: ns, NoConntrackCleanup: true})
	case "iptables":
		return iptables.New(iptables.Options{NetNS: ns, NoConntrackCleanup: true})
	}
	return nil, fmt.Errorf("unknown backend %q", backend)
}

func newDriver(backend string, n, m int) (*driver, error) {
	d := &driver{backend: backend, n: n, m: m}
	svcs, b, digest, err := benchlb.Workload(n, m)
	if err != nil {
		return nil, err
	}
	d.svcs, d.digest = svcs, digest
	d.st, d.b = b.State(), b
	d.p, err = newProxier(backend, 0)
	return d, err
}

// do runs one command: sync; change K MS (up to K one-endpoint changes,
// or fewer once MS milliseconds are spent, at least 3); change-edit K MS
// (the same, each change made by State.Edit of the last State); service K MS (K
// services added, then removed, one sync each); mem; floor-element K;
// floor-change K MS; floor-cold; cpuprofile FILE (starts, or stops without FILE);
// heapprofile FILE.
func (d *driver) do(ctx context.Context, f []string) (map[string]any, error) {
	arg := func(i, def int) int {
		if len(f) > i {
			if v, err := strconv.Atoi(f[i]); err == nil {
				return v
			}
		}
		return def
	}
	switch f[0] {
	case "sync":
		c0 := cpuMS(syscall.RUSAGE_SELF)
		t0 := time.Now()
		if _, err := d.p.Sync(ctx, d.st); err != nil {
			return nil, err
		}
		ms := msSince(t0)
		mem, err := benchwork.Memory()
		mem["ms"] = ms
		mem["cpu_ms"] = cpuMS(syscall.RUSAGE_SELF) - c0
		return mem, err
	case "change":
		d.syncCPU = 0
		s, err := d.changeSamples(ctx, arg(1, 100), arg(2, 30000))
		return map[string]any{"ms": s, "cpu_ms_each": d.syncCPU / float64(len(s))}, err
	case "change-edit":
		s, err := d.editSamples(ctx, arg(1, 100), arg(2, 30000))
		return map[string]any{"ms": s}, err
	case "service":
		add, del, err := d.serviceSamples(ctx, arg(1, 10), arg(2, 30000))
		return map[string]any{"add_ms": add, "delete_ms": del}, err
	case "mem":
		runtime.GC()
		debug.FreeOSMemory()
		return benchwork.Memory()
	case "floor-element":
		ms, err := elementFloor(ctx, arg(1, 100))
		return map[string]any{"ms": ms}, err
	case "floor-change":
		return d.changeFloor(ctx, arg(1, 100), arg(2, 30000))
	case "floor-cold":
		return d.coldFloor(ctx)
	case "cpuprofile":
		return nil, d.cpuProfile(f[1:])
	case "heapprofile":
		return nil, heapProfile(f[1:])
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}

func cpuMS(who int) float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(who, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e6
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Nanoseconds()) / 1e6 }

func (d *driver) apply(ctx context.Context, edit func(b *servicelb.Builder) error) (time.Duration, error) {
	if err := edit(d.b); err != nil {
		return 0, err
	}
	st := d.b.State()
	c0 := cpuMS(syscall.RUSAGE_SELF)
	t0 := time.Now()
	if _, err := d.p.Sync(ctx, st); err != nil {
		return 0, err
	}
	el := time.Since(t0)
	d.syncCPU += cpuMS(syscall.RUSAGE_SELF) - c0
	d.st = st
	return el, nil
}

// changeSamples replaces one endpoint of one service per sync.
func (d *driver) changeSamples(ctx context.Context, k, ms int) ([]float64, error) {
	return benchwork.Budget(k, ms, func(int) (time.Duration, error) {
		w := d.changed(d.svcs, d.changes)
		d.changes++
		return d.apply(ctx, func(b *servicelb.Builder) error { return b.Upsert(benchlb.Service(w)) })
	})
}

// changed makes the k-th one-endpoint change in svcs and returns the
// service it changed.
func (d *driver) changed(svcs []benchwork.Service, k int) benchwork.Service {
	i, j := benchwork.ChangeTarget(k, d.n, d.m)
	w := svcs[i]
	w.Endpoints = slices.Clone(w.Endpoints)
	w.Endpoints[j].Addr = benchwork.EndpointIP(benchwork.BaseReplacements, k)
	svcs[i] = w
	return w
}

// editSamples replaces one endpoint of one service per sync, as
// changeSamples does, each change made by editing the last State
// (State.Edit), as a caller that keeps States rather than a Builder
// does. Each sample times the whole change: the edit, the upsert and the
// sync. The changes after go on from the last Builder.
func (d *driver) editSamples(ctx context.Context, k, ms int) ([]float64, error) {
	return benchwork.Budget(k, ms, func(int) (time.Duration, error) {
		w := d.changed(d.svcs, d.changes)
		d.changes++
		t0 := time.Now()
		b := d.st.Edit()
		if err := b.Upsert(benchlb.Service(w)); err != nil {
			return 0, err
		}
		st := b.State()
		if _, err := d.p.Sync(ctx, st); err != nil {
			return 0, err
		}
		el := time.Since(t0)
		d.st, d.b = st, b
		return el, nil
	})
}

// serviceSamples adds k services one sync each, then deletes them.
func (d *driver) serviceSamples(ctx context.Context, k, ms int) (add, del []float64, err error) {
	var names []string
	add, err = benchwork.Budget(k, ms, func(int) (time.Duration, error) {
		x := d.added
		d.added++
		s := benchlb.Service(benchwork.Added(x, d.m))
		names = append(names, s.Name)
		return d.apply(ctx, func(b *servicelb.Builder) error { return b.Upsert(s) })
	})
	if err != nil {
		return add, nil, err
	}
	del, err = benchwork.Budget(len(names), 1<<30, func(i int) (time.Duration, error) {
		return d.apply(ctx, func(b *servicelb.Builder) error {
			if !b.Delete(names[i]) {
				return fmt.Errorf("no service %s", names[i])
			}
			return nil
		})
	})
	return add, del, err
}

// elementFloor is the median time of the cheapest element commit the
// kernel makes in this namespace: one element added to and deleted from a
// small set in a table of its own. Its cost grows with the rules loaded in
// the namespace, whichever table holds the set.
func elementFloor(ctx context.Context, k int) (float64, error) {
	conn, err := nfnl.Open(nfnl.Options{})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var setup nfnl.Batch
	setup.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "kproxy-bench-floor"})
	setup.AddSet(nfnl.Set{Family: nfnl.IPv4, Table: "kproxy-bench-floor", Name: "s", KeyType: 7, KeyLen: 4}) // ipv4_addr
	if _, err := conn.Commit(ctx, &setup); err != nil {
		return 0, err
	}
	defer func() {
		var b nfnl.Batch
		b.DelTable(nfnl.IPv4, "kproxy-bench-floor")
		_, _ = conn.Commit(ctx, &b)
	}()
	el := []nfnl.Element{{Key: []byte{10, 1, 2, 3}}}
	s, err := benchwork.Budget(k, 1<<30, func(int) (time.Duration, error) {
		var b nfnl.Batch
		b.AddElements(nfnl.IPv4, "kproxy-bench-floor", "s", el)
		b.DelElements(nfnl.IPv4, "kproxy-bench-floor", "s", el)
		t0 := time.Now()
		_, err := conn.Commit(ctx, &b)
		return time.Since(t0), err
	})
	if err != nil {
		return 0, err
	}
	return median(s), nil
}

func median(s []float64) float64 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s[len(s)/2]
}

// changeFloor measures the kernel's own cost of the one-endpoint changes
// the proxier makes: in a new namespace, a new proxier syncs the current
// state and then k changes like those of changeSamples (from a copy: the
// driver's own state stays), keeping the batch of each; another new
// namespace commits the same cold batches and then replays the changes'
// batches, each timed alone. Like changeSamples it makes up to k changes,
// or fewer once ms milliseconds are spent (at least 3). It returns the
// median time of the changes' syncs and of their replays: what a change
// costs over what its commit costs the kernel.
func (d *driver) changeFloor(ctx context.Context, k, ms int) (map[string]any, error) {
	var cold [][]byte
	var changes [][][]byte
	var syncs []float64
	err := d.withNewProxier(func(p proxier) error {
		t := tape{reel: &cold}
		tctx := t.context(ctx)
		if _, err := p.Sync(tctx, d.st); err != nil {
			return err
		}
		b, svcs := d.st.Edit(), slices.Clone(d.svcs)
		var err error
		syncs, err = benchwork.Budget(k, ms, func(i int) (time.Duration, error) {
			if err := b.Upsert(benchlb.Service(d.changed(svcs, d.changes+i))); err != nil {
				return 0, err
			}
			st := b.State()
			changes = append(changes, nil)
			t.reel = &changes[i]
			t0 := time.Now()
			_, err := p.Sync(tctx, st)
			return time.Since(t0), err
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	replays := make([]float64, len(changes))
	err = withNewConn(func(conn *nfnl.Conn) error {
		if err := replayAll(ctx, conn, cold); err != nil {
			return err
		}
		for i, fs := range changes {
			t0 := time.Now()
			if err := replayAll(ctx, conn, fs); err != nil {
				return fmt.Errorf("change %d: %w", i, err)
			}
			replays[i] = msSince(t0)
		}
		return nil
	})
	return map[string]any{"sync_ms": median(syncs), "replay_ms": median(replays)}, err
}

// coldFloor makes the same cold sync again, in a new empty namespace,
// keeping the batches it commits, and replays them in another new
// namespace with the bare netlink calls: the replay's time is the kernel's
// own cost of committing that state, the floor of any cold sync.
func (d *driver) coldFloor(ctx context.Context) (map[string]any, error) {
	var frames [][]byte
	var syncMS, syncCPU float64
	err := d.withNewProxier(func(p proxier) error {
		t := tape{reel: &frames}
		c0 := cpuMS(syscall.RUSAGE_SELF)
		t0 := time.Now()
		_, err := p.Sync(t.context(ctx), d.st)
		syncMS = msSince(t0)
		syncCPU = cpuMS(syscall.RUSAGE_SELF) - c0
		return err
	})
	if err != nil {
		return nil, err
	}
	var replayMS, replayCPU float64
	err = withNewConn(func(conn *nfnl.Conn) error {
		c0 := cpuMS(syscall.RUSAGE_THREAD)
		t0 := time.Now()
		err := replayAll(ctx, conn, frames)
		replayMS = msSince(t0)
		replayCPU = cpuMS(syscall.RUSAGE_THREAD) - c0
		return err
	})
	return map[string]any{"sync_ms": syncMS, "replay_ms": replayMS, "batches": len(frames), "sync_cpu_ms": syncCPU, "replay_cpu_ms": replayCPU}, err
}

// tape keeps the batches committed under its context (nfnl.WithTap), each
// into the reel it points to when it is committed.
type tape struct{ reel *[][]byte }

func (t *tape) context(ctx context.Context) context.Context {
	return nfnl.WithTap(ctx, func(f []byte) { *t.reel = append(*t.reel, slices.Clone(f)) })
}

// replayAll replays the captured batches in order (nfnl.Conn.Replay).
func replayAll(ctx context.Context, conn *nfnl.Conn, frames [][]byte) error {
	for _, f := range frames {
		if err := conn.Replay(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// withNewProxier runs f with a new proxier of the driver's backend in a
// new network namespace.
func (d *driver) withNewProxier(f func(p proxier) error) error {
	return inNewNS(func(ns netns.NsHandle) error {
		p, err := newProxier(d.backend, ns)
		if err != nil {
			return err
		}
		defer p.Close()
		return f(p)
	})
}

// withNewConn runs f with a netlink connection in a new network namespace.
func withNewConn(f func(conn *nfnl.Conn) error) error {
	return inNewNS(func(netns.NsHandle) error {
		conn, err := nfnl.Open(nfnl.Options{})
		if err != nil {
			return err
		}
		defer conn.Close()
		return f(conn)
	})
}

// inNewNS runs f on a thread in a new network namespace, with a handle of
// it; the namespace goes when f returns.
func inNewNS(f func(ns netns.NsHandle) error) error {
	return nsutil.DoNew(func() error {
		ns, err := netns.Get()
		if err != nil {
			return err
		}
		defer ns.Close()
		return f(ns)
	})
}

// cpuProfile starts a CPU profile into the file args names, or with no
// argument stops the one running.
func (d *driver) cpuProfile(args []string) error {
	if d.cpuProf != nil {
		pprof.StopCPUProfile()
		err := d.cpuProf.Close()
		d.cpuProf = nil
		if len(args) == 0 {
			return err
		}
	}
	if len(args) == 0 {
		return nil
	}
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return err
	}
	d.cpuProf = f
	return nil
}

// heapProfile writes the live heap, after a collection, into the file
// args names.
func heapProfile(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("heapprofile FILE")
	}
	f, err := os.Create(args[0])
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
