//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Sync makes the kernel match st. The first Sync (and the first after a
// failure, or after someone removed the dummy link) reads the proxier's
// virtual servers from the kernel and converges on st without touching what
// is already right; later ones send only what servicelb.Diff reports,
// after a cheap check, and a deep one when nothing changed or at most every
// Options.VerifyInterval, that nobody changed what the proxier owns. A
// service the proxier cannot apply (servicelb.ErrUnsupported,
// servicelb.ErrCapacity, ErrConflict) is left out before anything of it is
// sent, and one whose virtual or real servers the kernel refuses
// (servicelb.ErrRefused) once they are, and the rest applied: Sync then
// names them in its report (servicelb.SyncReport.LeftOut). IPVS is not transactional: Sync adds addresses,
// set entries, virtual servers and real servers before it removes any, so
// that no virtual address is ever left without its servers; if it fails
// part way, the next Sync reads the kernel and completes the change. Sync
// also deletes draining real servers whose connections have ended (see
// Drain).
func (p *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.renderOnly {
		return servicelb.SyncReport{}, fmt.Errorf("ipvs: sync: %w", ErrRenderOnly)
	}
	return p.eng.Sync(ctx, st)
}

// writes counts the changes sent to the kernel so far.
func (p *Proxier) writes() int { return p.k.writes + p.sets.writes + p.ruleWrites }

// engine is the Proxier's side of internal/syncer's Engine. The
// Engine calls it with p.mu held.
type engine Proxier

// Check looks up the dummy link and reads the helper rules' generation;
// helper rules someone changed are restored at once.
func (e *engine) Check(ctx context.Context) (bool, error) {
	p := (*Proxier)(e)
	if p.model == nil {
		return false, nil
	}
	return p.check(ctx, false)
}

// Verify also reads the link's addresses, the virtual servers with their
// real servers and the sets' headers: reads in proportion to the
// services, nothing sent.
func (e *engine) Verify(ctx context.Context) (bool, error) {
	return (*Proxier)(e).check(ctx, true)
}

// Write reads the kernel and converges on st.
func (e *engine) Write(ctx context.Context, st *servicelb.State) error {
	p := (*Proxier)(e)
	p.forget()
	return p.syncFull(ctx, st)
}

// Apply applies the changes; a node change converges in full.
func (e *engine) Apply(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (bool, error) {
	if ch.NodeChanged {
		return true, e.Write(ctx, st)
	}
	return false, (*Proxier)(e).syncChanges(ctx, st, ch)
}

// syncFull plans st in full and converges on it, reading the kernel first
// unless its state is known. Nothing changes until the plan has passed
// every check.
func (p *Proxier) syncFull(ctx context.Context, st *servicelb.State) error {
	plan, err := buildModel(st, &p.opts)
	if err != nil {
		return err
	}
	read := p.model == nil
	if read {
		foreign, err := p.readKernel(ctx)
		if err != nil {
			return err
		}
		if err := checkForeign(plan, foreign); err != nil {
			return err
		}
	}
	d := p.fullDelta(plan, read)
	if err := p.checkNew(ctx, d); err != nil {
		return err
	}
	if err := p.prepare(ctx, read); err != nil {
		p.forget()
		return err
	}
	p.nodeIP = plan.env.nodeIPs
	node := st.Node()
	if err := p.apply(ctx, d, func() error { return p.reconcileRules(ctx, &node, plan) }); err != nil {
		p.forget()
		return err
	}
	p.model = plan
	return nil
}

// fullDelta returns the delta from what the kernel holds to plan.
func (p *Proxier) fullDelta(plan *model, read bool) *delta {
	d := &delta{servers: map[vsKey]*VirtualServer{}, full: true, read: read, owner: plan.owner}
	for k := range p.kern {
		d.servers[k] = nil
	}
	maps.Copy(d.servers, plan.servers)
	for e := range plan.entries {
		d.add = append(d.add, e)
	}
	for e := range p.sets.have {
		if plan.entries[e] == 0 {
			d.del = append(d.del, e)
		}
	}
	return d
}

// prepare makes sure, after a read, of what every virtual server needs:
// the sysctls, the helper sets and the dummy link.
func (p *Proxier) prepare(ctx context.Context, read bool) error {
	if !read {
		return nil
	}
	if err := p.ensureSysctls(); err != nil {
		return err
	}
	if err := p.sets.ensure(ctx); err != nil {
		return err
	}
	l, err := p.k.ensureDummy(ctx)
	if err != nil {
		return err
	}
	p.link = l
	return nil
}

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

// syncChanges applies the changes from the applied state to st.
func (p *Proxier) syncChanges(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) error {
	s, err := p.model.plan(ch)
	if err != nil {
		return err
	}
	d := p.model.delta(s)
	if err := p.checkNew(ctx, d); err != nil {
		return err
	}
	if err := p.apply(ctx, d, func() error { return p.commitRules(ctx, d) }); err != nil {
		p.forget()
		return err
	}
	p.model.commit(s)
	return nil
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

// reconcileRules makes the helper rules match the node and the plan's
// steers, sending what differs.
func (p *Proxier) reconcileRules(ctx context.Context, node *servicelb.NodeConfig, plan *model) error {
	index := func(id string) uint16 { return p.sets.index[id] }
	stats, err := p.rules.Reconcile(ctx, allRules(&p.opts, node, index, plan))
	p.ruleWrites += stats.Messages
	if err != nil {
		return fmt.Errorf("helper rules: %w", err)
	}
	return nil
}

// commitRules replaces the steers of the ports a delta changes.
func (p *Proxier) commitRules(ctx context.Context, d *delta) error {
	if len(d.rules) == 0 {
		return nil
	}
	tx := xtables.NewTx()
	for slot, rules := range d.rules {
		n := ruleNames{o: &p.opts, f: slot.family}
		tx.SetKeyed(xtables.Table{Family: n.family(), Name: xtables.Mangle}, n.chain(steerChains[slot.chain]), slot.key, rules)
	}
	stats, err := p.rules.Commit(ctx, tx)
	p.ruleWrites += stats.Messages
	if err != nil {
		return fmt.Errorf("helper rules: %w", err)
	}
	return nil
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
		have := p.kern[vs.key()]
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
	return n == len(p.kern), nil
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
	if err != nil || len(prefixes) != len(p.present) {
		return false, err
	}
	for _, pf := range prefixes {
		if !pf.IsSingleIP() || !p.present[pf.Addr()] {
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
	p.link, p.stray = l, nil
	p.kern, p.present, p.use = map[vsKey]*VirtualServer{}, map[netip.Addr]bool{}, map[netip.Addr]int{}
	for _, pf := range prefixes {
		if pf.IsSingleIP() {
			p.present[pf.Addr()] = true
		} else {
			p.stray = append(p.stray, pf)
		}
	}
	servers, err := p.k.services(ctx)
	if err != nil {
		return nil, err
	}
	foreign := map[vsKey]bool{}
	for _, vs := range servers {
		if !p.owns(vs, p.present) {
			foreign[vs.key()] = true
			continue
		}
		if err := p.adopt(ctx, vs); err != nil {
			return nil, err
		}
	}
	p.dropStaleDrains()
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
		rk := realKey{vs.key(), r.AddrPort()}
		if _, ok := p.draining[rk]; r.Weight == 0 && !ok {
			p.draining[rk] = p.now()
		}
	}
	p.kern[vs.key()] = vs
	if vs.FWMark == 0 {
		p.use[vs.Addr]++
	}
	return nil
}

// dropStaleDrains forgets draining records of real servers that are gone
// or no longer at weight 0.
func (p *Proxier) dropStaleDrains() {
	for rk := range p.draining {
		vs := p.kern[rk.vs]
		if vs == nil {
			delete(p.draining, rk)
			continue
		}
		if i := vs.realIndex(rk.ap); i < 0 || vs.Real[i].Weight != 0 {
			delete(p.draining, rk)
		}
	}
}

func sortedKeys(m map[vsKey]*VirtualServer) []vsKey {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, compareKeys)
	return keys
}
