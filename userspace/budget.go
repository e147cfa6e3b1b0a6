//go:build linux

package userspace

import (
	"errors"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Flow budget. Every TCP or SCTP connection and UDP session through the
// proxy costs descriptors (a connection two sockets, and a pipe of two
// while bytes wait in each direction; a session one socket), and the
// process has a limit of them (RLIMIT_NOFILE), which everything else the
// agent does draws on too: netlink, the health and metrics servers, the
// connections to its API server. The proxy holds at most
// Options.MaxFlows flows at once, and a service port at most
// Options.MaxPortFlows of them, so that a flood of connections to one
// service never takes the descriptors the others, or the agent, need:
// a flow beyond either bound is shed at once (a connection reset before
// any endpoint is dialled, a new UDP client's datagram dropped), counted
// in its port's PortStats.Shed, and warned of at most every
// warnInterval.

// flowFDs is what a flow may cost in descriptors: a connection's two
// sockets and two pipes.
const flowFDs = 6

// DefaultMaxFlows returns the default of Options.MaxFlows: what the
// process's descriptor limit leaves for flows after a reserve of a tenth
// of it (at least 256) for everything else, at flowFDs each.
func DefaultMaxFlows() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 1024 / flowFDs
	}
	n := min(lim.Cur, 1<<24)
	reserve := max(n/10, 256)
	if n <= reserve+flowFDs {
		return 1
	}
	return int((n - reserve) / flowFDs)
}

// warnInterval is the least time between two warnings of one kind.
const warnInterval = 10 * time.Second

// budget counts the flows of the proxy; each portState counts its own.
type budget struct {
	max, portMax int64
	flows        atomic.Int64
	shedWarned   atomic.Int64 // Unix nanoseconds
	localWarned  atomic.Int64
}

// admit takes one flow of the budget for ps, or reports false when the
// proxy or the port holds its most.
func (b *budget) admit(ps *portState) bool {
	if b.flows.Add(1) > b.max {
		b.flows.Add(-1)
		return false
	}
	if ps.flows.Add(1) > b.portMax {
		ps.flows.Add(-1)
		b.flows.Add(-1)
		return false
	}
	return true
}

// release gives back a flow of ps.
func (b *budget) release(ps *portState) {
	ps.flows.Add(-1)
	b.flows.Add(-1)
}

// due reports whether a warning last given at *last may be given again,
// and marks it given.
func due(last *atomic.Int64) bool {
	now, was := time.Now().UnixNano(), last.Load()
	return (was == 0 || now-was >= int64(warnInterval)) && last.CompareAndSwap(was, now)
}

// shed counts and warns of a flow of ps that the budget refused.
func (p *Proxier) shed(ps *portState) {
	ps.stats.shed.Add(1)
	if due(&p.budget.shedWarned) {
		p.log.Warn("shedding new flows: the proxy holds its most", "port", ps.key,
			"portFlows", ps.flows.Load(), "maxPortFlows", p.budget.portMax, "flows", p.budget.flows.Load(), "maxFlows", p.budget.max)
	}
}

// localError reports whether err is the node's own want of descriptors
// or memory, not an endpoint's failure.
func localError(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM)
}

// local counts and warns of a local error met serving ps.
func (p *Proxier) local(ps *portState, op string, err error) {
	ps.stats.localErrors.Add(1)
	if due(&p.budget.localWarned) {
		p.log.Warn("out of descriptors or memory: new flows fail", "port", ps.key, "op", op, "err", err,
			"flows", p.budget.flows.Load(), "maxFlows", p.budget.max)
	}
}
