//go:build linux

package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// job is one service port to serve anew.
type job struct {
	sp     *servicelb.ServicePort
	ps     *portState
	fronts []front
}

// opening is a listener to open.
type opening struct {
	ps *portState
	f  front
}

// reconcile serves the ports of want and stops serving removed, touching
// only their listeners. A listener whose address and protocol stay is
// kept (and pointed at the new decision), even when it passes to another
// service port. A service whose port cannot be served is left out: its
// ports in want stop being served, and its error names it.
func (p *Proxier) reconcile(ctx context.Context, want []*servicelb.ServicePort, removed []*portState, full bool) error {
	failed := map[string]error{}
	fail := func(svc string, err error) { failed[svc] = errors.Join(failed[svc], err) }
	jobs := p.plan(want, full, fail)
	orphans := p.detach(jobs, removed)
	opens := p.claim(jobs, orphans, fail)
	var errs []error
	if p.held != nil {
		if err := p.held.flushAdds(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	p.openAll(opens, failed, fail)
	for k, l := range orphans {
		p.closeListener(k, l)
	}
	for _, j := range jobs {
		if _, bad := failed[j.sp.Key.Service]; bad {
			p.drop(j.ps)
			continue
		}
		p.settlePort(j.ps)
	}
	for _, ps := range removed {
		p.drop(ps)
	}
	if p.held != nil {
		if err := p.held.flushDels(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, err := range failed {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// openAll opens the listeners to open, but those of services that
// failed, with sockets made in one trip to the namespace.
func (p *Proxier) openAll(opens []opening, failed map[string]error, fail func(string, error)) {
	opens = slices.DeleteFunc(opens, func(o opening) bool { _, bad := failed[o.ps.key.Service]; return bad })
	var keys []listenKey
	for _, o := range opens {
		if _, ok := p.inherited[o.f.key]; !ok {
			keys = append(keys, o.f.key)
		}
	}
	fds, errs := p.socks.listenSockets(keys)
	j := 0
	for _, o := range opens {
		b := &binding{port: o.ps, kind: o.f.kind}
		var l *listener
		var err error
		fd, inherited := p.inherited[o.f.key]
		if !inherited {
			fd, err = fds[j], errs[j]
			j++
		}
		if _, bad := failed[o.ps.key.Service]; bad {
			if err == nil && !inherited {
				unix.Close(fd)
			}
			continue
		}
		if inherited {
			// An older process's listening socket (HandOver).
			delete(p.inherited, o.f.key)
			l, err = p.start(o.f.key, b, os.NewFile(uintptr(fd), o.f.key.String()))
		} else {
			l, err = p.open(o.f.key, b, fd, err)
		}
		if err != nil {
			fail(o.ps.key.Service, leftOut(o.ps.sp, portField(o.ps.sp), err))
			continue
		}
		o.ps.lns[o.f.key] = l
		p.listeners[o.f.key] = l
	}
}

// plan returns the ports of want to serve anew with their listeners: all
// of them for a whole write, else those whose decision changed.
func (p *Proxier) plan(want []*servicelb.ServicePort, full bool, fail func(string, error)) []job {
	caps := p.Capabilities()
	var own map[netip.Addr]bool
	if p.held != nil {
		own = p.held.ours
	}
	pl := newPlanner(&p.o, p.nodeCfg, own)
	jobs := make([]job, 0, len(want))
	for _, sp := range want {
		ps := p.ports[sp.Key]
		if !full && ps != nil && ps.sp == sp {
			continue
		}
		if err := caps.CheckPort(sp); err != nil {
			fail(sp.Key.Service, err)
			continue
		}
		fs, err := pl.fronts(sp)
		if err != nil {
			fail(sp.Key.Service, err)
			continue
		}
		if ps == nil {
			ps = newPortState(sp)
			p.ports[sp.Key] = ps
		}
		jobs = append(jobs, job{sp: sp, ps: ps, fronts: fs})
	}
	slices.SortFunc(jobs, func(a, b job) int { return a.sp.Key.Compare(b.sp.Key) })
	return jobs
}

// detach takes from their ports the listeners that removed ports had and
// that the jobs' ports no longer want (or that failed): they are closed
// at the end of the sync unless another port claims them meanwhile.
func (p *Proxier) detach(jobs []job, removed []*portState) map[listenKey]*listener {
	orphans := map[listenKey]*listener{}
	for _, ps := range removed {
		for k, l := range ps.lns {
			orphans[k] = l
		}
		clear(ps.lns)
	}
	for _, j := range jobs {
		keep := map[listenKey]bool{}
		for _, f := range j.fronts {
			keep[f.key] = f.listen
		}
		for k, l := range j.ps.lns {
			if !keep[k] || l.broken.Load() {
				orphans[k] = l
				delete(j.ps.lns, k)
			}
		}
	}
	return orphans
}

// claim points each job's port at its new decision and its listeners at
// the port: those it keeps, those it takes over from another port, and
// the ones to open, whose addresses it queues to hold.
func (p *Proxier) claim(jobs []job, orphans map[listenKey]*listener, fail func(string, error)) []opening {
	var opens []opening
	pending := map[listenKey]*portState{}
	for _, j := range jobs {
		j.ps.update(j.sp)
		p.hold(j.ps, j.fronts)
		for _, f := range j.fronts {
			if !f.listen {
				continue
			}
			b := &binding{port: j.ps, kind: f.kind}
			if l := j.ps.lns[f.key]; l != nil {
				if l.binding.Load().kind != f.kind {
					l.binding.Store(b)
				}
				continue
			}
			if l := orphans[f.key]; l != nil && !l.broken.Load() {
				delete(orphans, f.key)
				if old := l.binding.Swap(b); old.port != j.ps && l.udp != nil {
					l.udp.closeIf(func(*session) bool { return true })
				}
				j.ps.lns[f.key] = l
				continue
			}
			holder := pending[f.key]
			if other := p.listeners[f.key]; other != nil && orphans[f.key] != other {
				holder = other.binding.Load().port
			}
			if holder != nil {
				fail(j.sp.Key.Service, leftOut(j.sp, portField(j.sp), &ListenError{Protocol: f.key.proto, At: f.key.at.String(),
					Err: fmt.Errorf("%w (by %s)", errListenTaken, holder.key)}))
				continue
			}
			pending[f.key] = j.ps
			opens = append(opens, opening{ps: j.ps, f: f})
		}
	}
	return opens
}

// hold makes the addresses held for a port those its frontends hold: the
// new ones are queued to be added, those it no longer holds to be
// released.
func (p *Proxier) hold(ps *portState, fs []front) {
	var now []netip.Addr
	for _, f := range fs {
		if a := f.key.at.Addr(); f.hold && !slices.Contains(now, a) {
			now = append(now, a)
		}
	}
	for _, a := range now {
		if !slices.Contains(ps.held, a) {
			p.held.need(a)
		}
	}
	for _, a := range ps.held {
		if !slices.Contains(now, a) {
			p.held.release(a)
		}
	}
	ps.held = now
}

// closeListener closes a listener.
func (p *Proxier) closeListener(k listenKey, l *listener) {
	l.close()
	if p.listeners[k] == l {
		delete(p.listeners, k)
	}
}

// drop stops serving a port: its listeners close, its connections drain.
func (p *Proxier) drop(ps *portState) {
	for k, l := range ps.lns {
		p.closeListener(k, l)
	}
	clear(ps.lns)
	p.hold(ps, nil)
	if p.ports[ps.key] == ps {
		delete(p.ports, ps.key)
	}
	ps.gone.Store(true)
	p.redrain(ps)
}

// settlePort ends what a change of a port made stale: the UDP sessions to
// endpoints that stopped serving at once, the connections to them after
// Options.DrainTimeout.
func (p *Proxier) settlePort(ps *portState) {
	p.redrain(ps)
	if ps.proto != servicelb.UDP {
		return
	}
	sp := ps.sp
	for _, l := range ps.lns {
		n := l.udp.closeIf(func(s *session) bool { return !sp.Serves(s.to) })
		ps.stats.drained.Add(uint64(n))
	}
}
