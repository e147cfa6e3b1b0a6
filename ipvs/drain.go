//go:build linux

package ipvs

import (
	"context"
	"maps"
	"slices"
)

// Drain deletes the draining real servers (removed real servers kept
// at weight 0) whose connections have ended or whose graceful timeout has
// passed, and returns how many still drain. Sync does the same; call Drain
// between syncs (every few seconds, say) to delete them sooner.
func (p *Proxier) Drain(ctx context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.errIf(); err != nil {
		return 0, err
	}
	if err := p.drain(ctx); err != nil {
		p.forget()
		return len(p.kern.draining), err
	}
	return len(p.kern.draining), nil
}

// drain checks each virtual server with draining real servers once, and
// deletes in one batch those whose connections ended or whose graceful
// timeout passed.
func (p *Proxier) drain(ctx context.Context) error {
	byVS := map[vsKey][]realKey{}
	for rk := range p.kern.draining {
		byVS[rk.vs] = append(byVS[rk.vs], rk)
	}
	now := p.now()
	keys := slices.Collect(maps.Keys(byVS))
	slices.SortFunc(keys, compareKeys)
	var ops []ipvsOp
	for _, k := range keys {
		rks := byVS[k]
		vs := p.kern.servers[k]
		if vs == nil {
			continue
		}
		info, err := p.k.reals(ctx, vs)
		if err != nil {
			return err
		}
		for _, rk := range rks {
			i := slices.IndexFunc(info, func(ri realInfo) bool { return ri.AddrPort() == rk.ap })
			if i < 0 {
				delete(p.kern.draining, rk)
				continue
			}
			conns := info[i].active + info[i].inactive
			if conns > 0 && now.Sub(p.kern.draining[rk]) < p.opts.GracefulTimeout {
				continue
			}
			ops = append(ops, ipvsOp{kind: delReal, vs: vs, r: info[i].RealServer})
			p.log.Debug("ipvs: deleting drained real server", "server", realName(vs, info[i].RealServer), "connections", conns)
		}
		delete(byVS, k)
	}
	for _, rks := range byVS {
		for _, rk := range rks {
			delete(p.kern.draining, rk)
		}
	}
	return p.write(ctx, ops, nil)
}
