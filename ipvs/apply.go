//go:build linux

package ipvs

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// apply makes the kernel match d, in an order that never leaves a virtual
// address without its servers, nor a virtual server unrecorded, nor a flow
// steered to a missing one: addresses and set entries first, then new and
// changed virtual servers (real servers added before others are removed),
// then the rules, then removed virtual servers, then addresses and set
// entries no longer used. It keeps p.kern, p.present and p.use up to date
// as it goes.
func (p *Proxier) apply(ctx context.Context, d *delta, rules func() error) error {
	keys := sortedKeys(d.servers)
	if err := p.addAddresses(ctx, d, keys); err != nil {
		return err
	}
	if err := p.sets.add(ctx, d.add); err != nil {
		return err
	}
	for _, k := range keys {
		want := d.servers[k]
		if want == nil {
			continue
		}
		var err error
		if have := p.kern[k]; have == nil {
			err = p.create(ctx, want)
		} else {
			err = p.update(ctx, have, want)
		}
		if err != nil {
			return refused(err, d.owner[k])
		}
	}
	if err := rules(); err != nil {
		return err
	}
	gone, err := p.deleteServers(ctx, d, keys)
	if err != nil {
		return err
	}
	if d.full {
		gone = slices.Collect(maps.Keys(p.present))
	}
	if err := p.deleteAddresses(ctx, gone, d.full); err != nil {
		return err
	}
	return p.sets.del(ctx, d.del)
}

// refused traces the kernel's refusal of a virtual or real server op
// (an errno) to the service port the virtual server serves, so that the
// sync leaves that service out and applies the rest; other errors, such
// as the end of the context, stay as they are.
func refused(err error, owner servicelb.ServicePortKey) error {
	var errno syscall.Errno
	if owner.Service == "" || !errors.As(err, &errno) {
		return err
	}
	return syncer.Refused(owner, err)
}

// checkNew refuses, before any change, to create a virtual server that
// exists already: not being the proxier's, it is someone else's. (A sync
// that has just read the kernel knows them all.)
func (p *Proxier) checkNew(ctx context.Context, d *delta) error {
	if d.read {
		return nil
	}
	var errs []error
	for _, k := range sortedKeys(d.servers) {
		if want := d.servers[k]; want != nil && p.kern[k] == nil {
			exists, err := p.k.exists(ctx, want)
			if err != nil {
				return err
			}
			if exists {
				errs = append(errs, foreignServer(k, d.owner[k], "(it appeared since the kernel was read)"))
			}
		}
	}
	return errors.Join(errs...)
}

// addAddresses puts the addresses of the virtual servers d adds on the
// dummy link, node addresses aside.
func (p *Proxier) addAddresses(ctx context.Context, d *delta, keys []vsKey) error {
	for _, k := range keys {
		if d.servers[k] == nil || k.fwmark != 0 || p.present[k.addr] || p.nodeIP[k.addr] {
			continue
		}
		if err := p.k.addAddress(ctx, p.link, k.addr); err != nil {
			return err
		}
		p.present[k.addr] = true
	}
	return nil
}

// create adds a virtual server and its real servers.
func (p *Proxier) create(ctx context.Context, want *VirtualServer) error {
	if err := p.k.newService(ctx, want); err != nil {
		return err
	}
	got := want.clone()
	got.Real = nil
	p.kern[want.key()] = got
	if want.FWMark == 0 {
		p.use[want.Addr]++
	}
	for _, r := range want.Real {
		if err := p.k.newReal(ctx, want, r); err != nil {
			return err
		}
		got.Real = append(got.Real, r)
	}
	return nil
}

// update changes a virtual server from what the kernel has to want: its
// settings, then new and re-weighted real servers, then removed ones.
func (p *Proxier) update(ctx context.Context, have, want *VirtualServer) error {
	k := want.key()
	if !sameService(have, want) {
		if err := p.k.updateService(ctx, want); err != nil {
			return err
		}
		have.Scheduler, have.Persistence, have.HashPort = want.Scheduler, want.Persistence, want.HashPort
	}
	for _, r := range want.Real {
		i := have.realIndex(r.AddrPort())
		switch {
		case i < 0:
			if err := p.k.newReal(ctx, want, r); err != nil {
				return err
			}
			have.Real = append(have.Real, r)
		case have.Real[i].Weight != r.Weight:
			if err := p.k.updateReal(ctx, want, r); err != nil {
				return err
			}
			have.Real[i].Weight = r.Weight
		}
		delete(p.draining, realKey{k, r.AddrPort()})
	}
	var gone []RealServer
	for _, r := range have.Real {
		if want.realIndex(r.AddrPort()) < 0 {
			gone = append(gone, r)
		}
	}
	if err := p.removeReals(ctx, have, want, gone); err != nil {
		return err
	}
	slices.SortFunc(have.Real, compareReal)
	return nil
}

// removeReals removes real servers from vs (as the kernel holds it), as
// want asks. A real server with connections drains: it stays at weight 0,
// taking no new flow while its own go on, until they end or the graceful
// timeout passes, when it is TCP, or UDP or SCTP with an endpoint that
// still serves the port (servicelb keeps such flows: the endpoint is only
// no longer chosen). The others go at once; the flows of a UDP or SCTP one
// are then servicelb's stale flows.
func (p *Proxier) removeReals(ctx context.Context, vs, want *VirtualServer, gone []RealServer) error {
	drains := func(r RealServer) bool {
		_, serving := slices.BinarySearchFunc(want.serving, r.Addr, netip.Addr.Compare)
		return want.Protocol == servicelb.TCP || serving
	}
	if !slices.ContainsFunc(gone, drains) {
		for _, r := range gone {
			if err := p.deleteReal(ctx, vs, r); err != nil {
				return err
			}
		}
		return nil
	}
	info, err := p.k.reals(ctx, vs)
	if err != nil {
		return err
	}
	for _, r := range gone {
		rk := realKey{vs.key(), r.AddrPort()}
		i := slices.IndexFunc(info, func(ri realInfo) bool { return ri.AddrPort() == r.AddrPort() })
		if drains(r) && i >= 0 && info[i].active+info[i].inactive > 0 {
			if err := p.quiesce(ctx, vs, r, rk); err != nil {
				return err
			}
			continue
		}
		if err := p.deleteReal(ctx, vs, r); err != nil {
			return err
		}
	}
	return nil
}

// quiesce sets a real server with connections to weight 0 and records it
// as draining.
func (p *Proxier) quiesce(ctx context.Context, vs *VirtualServer, r RealServer, rk realKey) error {
	if r.Weight != 0 {
		r.Weight = 0
		if err := p.k.updateReal(ctx, vs, r); err != nil {
			return err
		}
		vs.Real[vs.realIndex(r.AddrPort())].Weight = 0
	}
	if _, ok := p.draining[rk]; !ok {
		p.draining[rk] = p.now()
		p.log.Debug("ipvs: real server draining", "server", realName(vs, r))
	}
	return nil
}

// deleteReal deletes a real server and forgets it.
func (p *Proxier) deleteReal(ctx context.Context, vs *VirtualServer, r RealServer) error {
	if err := p.k.delReal(ctx, vs, r); err != nil {
		return err
	}
	vs.Real = slices.DeleteFunc(vs.Real, func(x RealServer) bool { return x.AddrPort() == r.AddrPort() })
	delete(p.draining, realKey{vs.key(), r.AddrPort()})
	return nil
}

// deleteServers deletes the virtual servers d removes and returns their
// addresses.
func (p *Proxier) deleteServers(ctx context.Context, d *delta, keys []vsKey) ([]netip.Addr, error) {
	var addrs []netip.Addr
	for _, k := range keys {
		have := p.kern[k]
		if d.servers[k] != nil || have == nil {
			continue
		}
		if err := p.k.delService(ctx, have); err != nil {
			return nil, err
		}
		for _, r := range have.Real {
			delete(p.draining, realKey{k, r.AddrPort()})
		}
		delete(p.kern, k)
		if k.fwmark == 0 {
			p.use[k.addr]--
			addrs = append(addrs, k.addr)
		}
	}
	return addrs, nil
}

// deleteAddresses removes from the dummy link the addresses among
// candidates that no virtual server uses any more or that are node
// addresses, and the stray ones when full.
func (p *Proxier) deleteAddresses(ctx context.Context, candidates []netip.Addr, full bool) error {
	slices.SortFunc(candidates, netip.Addr.Compare)
	for _, a := range slices.Compact(candidates) {
		if !p.present[a] || (p.use[a] > 0 && !p.nodeIP[a]) {
			continue
		}
		if err := p.k.delAddress(ctx, p.link, netip.PrefixFrom(a, a.BitLen())); err != nil {
			return err
		}
		delete(p.present, a)
	}
	if !full {
		return nil
	}
	for _, pf := range p.stray {
		if err := p.k.delAddress(ctx, p.link, pf); err != nil {
			return err
		}
	}
	p.stray = nil
	return nil
}
