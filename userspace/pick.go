//go:build linux

package userspace

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// targets is one set of endpoints of a service port (its Cluster or Local
// set) as the scheduler picks from it. It is made anew at each change of
// the port and never changes after, but for the round-robin state.
type targets struct {
	backends []servicelb.Backend
	// cum holds the running sums of the weights, for weighted random
	// picks.
	cum   []uint64
	index map[netip.AddrPort]int
	// rr, when set, picks in smooth weighted round robin instead.
	rr *roundRobin
}

func newTargets(bs []servicelb.Backend, sch servicelb.Scheduler) *targets {
	t := &targets{backends: bs, cum: make([]uint64, len(bs)), index: make(map[netip.AddrPort]int, len(bs))}
	var sum uint64
	for i, b := range bs {
		sum += uint64(b.Weight)
		t.cum[i] = sum
		t.index[b.AddrPort()] = i
	}
	switch sch {
	case servicelb.SchedulerRoundRobin:
		t.rr = newRoundRobin(bs, false)
	case servicelb.SchedulerWeightedRR:
		t.rr = newRoundRobin(bs, true)
	}
	return t
}

// tried is the set of endpoints a connection has tried, by index.
type tried []int

func (tr tried) has(i int) bool { return slices.Contains(tr, i) }

// pick returns the index of an endpoint not in tr, in proportion to the
// weights, or -1 when every endpoint has been tried.
func (t *targets) pick(tr tried) int {
	n := len(t.backends)
	if len(tr) >= n {
		return -1
	}
	if t.rr != nil {
		return t.rr.next(tr)
	}
	if len(tr) == 0 {
		r := rand.Uint64N(t.cum[n-1])
		i, _ := slices.BinarySearch(t.cum, r+1)
		return i
	}
	var left uint64
	for i, b := range t.backends {
		if !tr.has(i) {
			left += uint64(b.Weight)
		}
	}
	r := rand.Uint64N(left)
	for i, b := range t.backends {
		if tr.has(i) {
			continue
		}
		if r < uint64(b.Weight) {
			return i
		}
		r -= uint64(b.Weight)
	}
	return -1
}

// roundRobin is smooth weighted round robin: over each cycle of the sum
// of the weights, every endpoint takes exactly its weight of picks,
// interleaved.
type roundRobin struct {
	mu      sync.Mutex
	weights []int64
	current []int64
	total   int64
}

func newRoundRobin(bs []servicelb.Backend, weighted bool) *roundRobin {
	r := &roundRobin{weights: make([]int64, len(bs)), current: make([]int64, len(bs))}
	for i, b := range bs {
		r.weights[i] = 1
		if weighted {
			r.weights[i] = int64(b.Weight)
		}
		r.total += r.weights[i]
	}
	return r
}

func (r *roundRobin) next(tr tried) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	best := -1
	var total int64
	for i, w := range r.weights {
		if tr.has(i) {
			continue
		}
		r.current[i] += w
		total += w
		if best < 0 || r.current[i] > r.current[best] {
			best = i
		}
	}
	if best >= 0 {
		r.current[best] -= total
	}
	return best
}

// pins are the ClientIP affinity of one set of endpoints of a service
// port: each client address pinned to the endpoint it reached and when it
// last opened a flow. They outlive changes of the port's endpoints: a pin
// to an endpoint that left the set is ignored and replaced.
type pins struct {
	mu    sync.Mutex
	m     map[netip.Addr]pin
	sweep int // size at which expired pins are swept next
}

type pin struct {
	to   netip.AddrPort
	last time.Time
}

const minSweep = 1024

func newPins() *pins { return &pins{m: map[netip.Addr]pin{}, sweep: minSweep} }

// get returns the endpoint client is pinned to, if the pin is younger
// than timeout, and renews it.
func (p *pins) get(client netip.Addr, now time.Time, timeout time.Duration) (netip.AddrPort, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	x, ok := p.m[client]
	if !ok || now.Sub(x.last) >= timeout {
		return netip.AddrPort{}, false
	}
	x.last = now
	p.m[client] = x
	return x.to, true
}

// set pins client to an endpoint. Expired pins are swept whenever the
// map has doubled since the last sweep, so that it stays in proportion to
// the clients of the last timeout.
func (p *pins) set(client netip.Addr, to netip.AddrPort, now time.Time, timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[client] = pin{to: to, last: now}
	if len(p.m) < p.sweep {
		return
	}
	for c, x := range p.m {
		if now.Sub(x.last) >= timeout {
			delete(p.m, c)
		}
	}
	p.sweep = max(minSweep, 2*len(p.m))
}

// drop removes client's pin to an endpoint that failed.
func (p *pins) drop(client netip.Addr, to netip.AddrPort) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m[client].to == to {
		delete(p.m, client)
	}
}
