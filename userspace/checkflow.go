//go:build linux

package userspace

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/sockaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var _ servicelb.FlowChecker = (*Proxier)(nil)

// CheckFlow reads back what serves the flow e explains: the proxy's own
// tables (the listener of the frontend, what it is bound to serve, the
// endpoints the data path picks from and their weights) and the kernel's
// word on them (the address the listening socket is bound to, the held
// address on the link). A frontend whose port rejects every flow has no
// listener, so that the kernel refuses its flows. It reports every
// listener missing, broken, in the way or serving something else, every
// endpoint set that differs from the explanation's, and every held
// address missing.
func (p *Proxier) CheckFlow(ctx context.Context, e *servicelb.Explanation) (servicelb.KernelCheck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.renderOnly:
		return servicelb.KernelCheck{}, fmt.Errorf("userspace: check a flow: %w", ErrRenderOnly)
	case p.closed:
		return servicelb.KernelCheck{}, ErrClosed
	}
	c := &serveCheck{out: servicelb.KernelCheck{Backend: "userspace"}}
	sp, why := p.eng.Explained(e)
	switch {
	case why != "":
		c.differ("%s", why)
		return c.out, nil
	case sp == nil:
		k := listenKey{proto: e.Flow.Protocol, at: e.Flow.Dst}
		if l := p.listeners[k]; l != nil {
			c.differ("listener %s exists: it takes a flow no frontend of the state serves", k)
		} else {
			c.read("no listener %s", k)
		}
		return c.out, nil
	}
	ps := p.ports[sp.Key]
	if ps == nil {
		c.differ("service port %s is not served", sp.Key)
		return c.out, nil
	}
	var own map[netip.Addr]bool
	if p.held != nil {
		own = p.held.ours
	}
	fronts, err := newPlanner(&p.o, p.nodeCfg, own).fronts(sp)
	if err != nil {
		return c.out, fmt.Errorf("userspace: check a flow: %w", err)
	}
	at := e.Frontend.AddrPort()
	if p.o.Listen != nil {
		var ok bool
		if at, ok = p.o.Listen(sp, e.Frontend); !ok {
			c.read("the frontend %s is served nowhere: Options.Listen puts it nowhere", e.Frontend)
			return c.out, nil
		}
	}
	i := slices.IndexFunc(fronts, func(f front) bool { return f.key.at == at && f.kind == e.Frontend.Kind })
	if i < 0 {
		return c.out, fmt.Errorf("userspace: check a flow: the frontend %s of %s is planned nowhere", e.Frontend, sp.Key)
	}
	f := fronts[i]
	l := p.listeners[f.key]
	switch {
	case !f.listen && l != nil:
		c.differ("listener %s exists, though the port rejects every flow: the kernel must refuse them", f.key)
	case !f.listen:
		c.read("no listener %s: the port rejects every flow, the kernel refuses them", f.key)
	case l == nil:
		c.differ("listener %s is missing", f.key)
	default:
		c.listener(l, ps, f)
	}
	if f.hold {
		if p.held == nil || p.held.refs[f.key.at.Addr()] == 0 {
			c.differ("address %s is not held", f.key.at.Addr())
		} else if err := c.heldOnLink(ctx, p.held, f.key.at.Addr()); err != nil {
			return c.out, err
		}
	}
	c.targets(ps, e)
	return c.out, nil
}

// serveCheck gathers what CheckFlow reads and finds.
type serveCheck struct {
	out servicelb.KernelCheck
}

func (c *serveCheck) read(format string, args ...any) {
	c.out.Read = append(c.out.Read, fmt.Sprintf(format, args...))
}

func (c *serveCheck) differ(format string, args ...any) {
	c.out.Differences = append(c.out.Differences, fmt.Sprintf(format, args...))
}

// listener checks that l serves the port's frontend, and asks the kernel
// where its socket is bound.
func (c *serveCheck) listener(l *listener, ps *portState, f front) {
	b := l.binding.Load()
	switch {
	case l.broken.Load():
		c.differ("listener %s is broken: its goroutine ended on an error; the next sync opens it again", f.key)
		return
	case b == nil || b.port != ps || b.kind != f.kind:
		c.differ("listener %s serves another frontend", f.key)
		return
	}
	var bound netip.AddrPort
	var serr error
	err := l.rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, serr = unix.Getsockname(int(fd)); serr == nil {
			bound = sockaddr.To(sa)
		}
	})
	switch {
	case err != nil || serr != nil:
		c.differ("listener %s: its socket cannot be read: %v", f.key, cmpErr(err, serr))
	case bound != f.key.at:
		c.differ("listener %s: its socket is bound to %s", f.key, bound)
	default:
		c.read("listener %s: socket bound to %s, serving the %s", f.key, bound, f.kind)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// heldOnLink checks that the kernel holds address a on the proxy's link.
func (c *serveCheck) heldOnLink(ctx context.Context, h *holder, a netip.Addr) error {
	list, err := h.rt.Addrs(ctx, h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	for _, x := range list {
		if x.Prefix.Addr() == a {
			c.read("link %s: %s", h.link, a)
			return nil
		}
	}
	c.differ("link %s: address %s is missing", h.link, a)
	return nil
}

// targets compares the endpoints the data path picks from for the
// explained verdict with the explanation's, weights included.
func (c *serveCheck) targets(ps *portState, e *servicelb.Explanation) {
	t := ps.tab.Load()
	if t == nil || !t.sp.Equal(e.Port) {
		c.differ("the data path of %s follows another decision than the explanation's", e.Port.Key)
		return
	}
	if !e.Verdict.Action.Forwards() {
		return
	}
	set := clusterSet
	if e.Verdict.Action == servicelb.ToLocal {
		set = localSet
	}
	var have []servicelb.Backend
	if t.sets[set] != nil {
		have = t.sets[set].backends
	}
	if !slices.Equal(have, e.Endpoints) {
		c.differ("the data path picks from %v, the explanation names %v", have, e.Endpoints)
		return
	}
	for _, b := range have {
		c.read("endpoint %s weight %d", b, b.Weight)
	}
}
