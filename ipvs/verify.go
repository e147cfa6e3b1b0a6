//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// checkForeign refuses a plan that needs a virtual server someone else
// owns.
func checkForeign(plan *model, foreign map[vsKey]bool) error {
	var errs []error
	for _, k := range sortedKeys(plan.servers) {
		if foreign[k] {
			errs = append(errs, foreignServer(k, plan.owner[k],
				"(its address is not on the dummy link, nor is it in the proxier's sets)"))
		}
	}
	return errors.Join(errs...)
}

// foreignServer is the error of a service port that needs a virtual
// server someone else holds: it names the service, so that the sync
// leaves that service out and applies the rest.
func foreignServer(k vsKey, owner servicelb.ServicePortKey, why string) error {
	err := fmt.Errorf("%w: %w: %s exists and is not the proxier's %s", servicelb.ErrFrontendTaken, ErrConflict, k, why)
	if owner.Service == "" {
		return err
	}
	return &servicelb.ValidationError{Service: owner.Service, Field: "ports", Value: owner.String(), Err: err}
}

// check tests that nobody removed or changed what the proxier owns: the
// dummy link and, thorough, its addresses, the virtual servers with their
// real servers, and the sets' headers (set entries by count). It reports false
// when something is gone or changed: the sync then reads the kernel again
// and repairs it. Helper rules someone changed are restored at once.
func (p *Proxier) check(ctx context.Context, thorough bool) (bool, error) {
	ok, err := p.linkIntact(ctx, thorough)
	if thorough && err == nil && ok {
		ok, err = p.serversIntact(ctx)
	}
	if thorough && err == nil && ok {
		ok, err = p.sets.intact(ctx)
	}
	if err != nil || !ok {
		return false, err
	}
	if ok, err = p.rules.Check(ctx); err != nil {
		return false, fmt.Errorf("helper rules: %w", err)
	}
	if !ok {
		p.log.Info("helper rules changed by someone else; restoring them")
		node := p.eng.Applied().Node()
		return true, p.reconcileRules(ctx, &node, p.model)
	}
	return true, nil
}

// serversIntact reports whether every virtual server of the proxier is
// still there, with its settings and its real servers at their weights:
// one read of the virtual servers, and one of each one's real servers.
func (p *Proxier) serversIntact(ctx context.Context) (bool, error) {
	servers, err := p.k.services(ctx)
	if err != nil {
		return false, err
	}
	n := 0
	for _, vs := range servers {
		have := p.kern.servers[vs.key()]
		if have == nil {
			continue
		}
		if !sameService(have, vs) {
			return false, nil
		}
		if ok, err := p.realsIntact(ctx, have); err != nil || !ok {
			return false, err
		}
		n++
	}
	return n == len(p.kern.servers), nil
}

// realsIntact reports whether the kernel holds exactly vs's real servers,
// at their weights.
func (p *Proxier) realsIntact(ctx context.Context, vs *VirtualServer) (bool, error) {
	got, err := p.k.reals(ctx, vs)
	if err != nil {
		return false, err
	}
	same := len(got) == len(vs.Real)
	for _, r := range got {
		i := vs.realIndex(r.AddrPort())
		same = same && i >= 0 && vs.Real[i].Weight == r.Weight
	}
	if !same {
		p.log.Info("ipvs: real servers changed by someone else", "server", vs.key().String(), "reals", len(got), "want", len(vs.Real))
	}
	return same, nil
}

// linkIntact reports whether the dummy link is still the one last seen,
// and with addrs, whether it has the addresses last put on it.
func (p *Proxier) linkIntact(ctx context.Context, addrs bool) (bool, error) {
	l, ok, err := p.k.dummy(ctx)
	if err != nil || !ok || p.link.Index == 0 || l.Index != p.link.Index {
		return false, err
	}
	if !addrs {
		return true, nil
	}
	prefixes, err := p.k.addresses(ctx, l)
	if err != nil || len(prefixes) != len(p.kern.present) {
		return false, err
	}
	for _, pf := range prefixes {
		if !pf.IsSingleIP() || !p.kern.present[pf.Addr()] {
			return false, nil
		}
	}
	return true, nil
}

// readKernel learns the proxier's state from the kernel, changing nothing:
// the helper sets' entries, the dummy link and its addresses, and the
// proxier's virtual servers with their real servers (those on the link's
// addresses and those its sets record). It returns the other virtual
// servers' keys.
func (p *Proxier) readKernel(ctx context.Context) (map[vsKey]bool, error) {
	if err := p.sets.load(ctx); err != nil {
		return nil, err
	}
	l, ok, err := p.k.dummy(ctx)
	if err != nil {
		return nil, err
	}
	var prefixes []netip.Prefix
	if ok {
		if prefixes, err = p.k.addresses(ctx, l); err != nil {
			return nil, err
		}
	}
	p.link = l
	p.kern.read(prefixes)
	servers, err := p.k.services(ctx)
	if err != nil {
		return nil, err
	}
	foreign := map[vsKey]bool{}
	for _, vs := range servers {
		if !p.owns(vs, p.kern.present) {
			foreign[vs.key()] = true
			continue
		}
		if err := p.adopt(ctx, vs); err != nil {
			return nil, err
		}
	}
	p.kern.dropStaleDrains()
	return foreign, nil
}

// adopt records one of the proxier's virtual servers found in the kernel.
func (p *Proxier) adopt(ctx context.Context, vs *VirtualServer) error {
	reals, err := p.k.reals(ctx, vs)
	if err != nil {
		return err
	}
	for _, r := range reals {
		vs.Real = append(vs.Real, r.RealServer)
	}
	p.kern.adopt(vs, p.now())
	return nil
}
