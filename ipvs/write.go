//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"syscall"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// apply makes the kernel match d, in an order that never leaves a virtual
// address without its servers, nor a virtual server unrecorded, nor a flow
// steered to a missing one: addresses and set entries first, then new and
// changed virtual servers, then their new and re-weighted real servers,
// then (only if all of that succeeded) the real servers they lose, then
// the rules, then removed virtual servers, then addresses and set entries
// no longer used. Each step is one batch of requests, many to a system
// call; the kernel handles every request of a batch, so a step that
// depends on the previous one's success is a batch of its own. A virtual
// or real server the kernel refuses fails its step with an error traced
// to the service port it serves (see tracedErrors). It keeps the mirror
// p.kern up to date as it goes, request by request.
func (p *Proxier) apply(ctx context.Context, d *delta, rules func() error) error {
	keys := sortedKeys(d.servers)
	if err := p.addAddresses(ctx, d, keys); err != nil {
		return err
	}
	if err := p.sets.add(ctx, d.add); err != nil {
		return err
	}
	if err := p.putServers(ctx, d, keys); err != nil {
		return err
	}
	if err := p.putReals(ctx, d, keys); err != nil {
		return err
	}
	if err := p.dropReals(ctx, d, keys); err != nil {
		return err
	}
	if err := rules(); err != nil {
		return err
	}
	gone, err := p.deleteServers(ctx, d, keys)
	if err != nil {
		return err
	}
	if d.full {
		gone = slices.Collect(maps.Keys(p.kern.present))
	}
	if err := p.deleteAddresses(ctx, gone, d.full); err != nil {
		return err
	}
	return p.sets.del(ctx, d.del)
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
		if want := d.servers[k]; want != nil && p.kern.servers[k] == nil {
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
	var add []netip.Addr
	for _, k := range keys {
		if d.servers[k] == nil || k.fwmark != 0 || p.kern.present[k.addr] || p.nodeIP[k.addr] {
			continue
		}
		if n := len(add); n == 0 || add[n-1] != k.addr {
			add = append(add, k.addr)
		}
	}
	if len(add) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	errs, err := p.k.changeAddresses(ctx, p.link, add, nil)
	for i, a := range add {
		if errs[i] == nil {
			p.kern.present[a] = true
		}
	}
	return firstErrors(errs, err)
}

// putServers creates the virtual servers d adds, without real servers, and
// changes the settings of those it changes.
func (p *Proxier) putServers(ctx context.Context, d *delta, keys []vsKey) error {
	var ops []ipvsOp
	for _, k := range keys {
		want, have := d.servers[k], p.kern.servers[k]
		switch {
		case want == nil:
		case have == nil:
			ops = append(ops, ipvsOp{kind: newService, vs: want})
		case !sameService(have, want):
			ops = append(ops, ipvsOp{kind: updateService, vs: want})
		}
	}
	return p.write(ctx, ops, d.owner)
}

// putReals adds the real servers the virtual servers of d lack and
// re-weights those whose weight changed.
func (p *Proxier) putReals(ctx context.Context, d *delta, keys []vsKey) error {
	var ops []ipvsOp
	for _, k := range keys {
		want, have := d.servers[k], p.kern.servers[k]
		if want == nil || have == nil {
			continue
		}
		for _, r := range want.Real {
			switch i := have.realIndex(r.AddrPort()); {
			case i < 0:
				ops = append(ops, ipvsOp{kind: newReal, vs: want, r: r})
			case have.Real[i].Weight != r.Weight:
				ops = append(ops, ipvsOp{kind: updateReal, vs: want, r: r})
			default:
				delete(p.kern.draining, realKey{k, r.AddrPort()})
			}
		}
	}
	return p.write(ctx, ops, d.owner)
}

// dropReals removes from the virtual servers of d the real servers they
// no longer want. A real server with connections drains: it stays at
// weight 0, taking no new flow while its own go on, until they end or the
// graceful timeout passes, when it is TCP, or UDP or SCTP with an endpoint
// that still serves the port (servicelb keeps such flows: the endpoint is
// only no longer chosen). The others go at once; the flows of a UDP or
// SCTP one are then servicelb's stale flows.
func (p *Proxier) dropReals(ctx context.Context, d *delta, keys []vsKey) error {
	var ops []ipvsOp
	for _, k := range keys {
		want, have := d.servers[k], p.kern.servers[k]
		if want == nil || have == nil {
			continue
		}
		more, err := p.removals(ctx, have, want)
		if err != nil {
			return err
		}
		ops = append(ops, more...)
	}
	return p.write(ctx, ops, d.owner)
}

// removals returns the changes that remove from vs (as the kernel holds
// it) the real servers want does not have: quiesce those that drain,
// delete the others. It reads vs's connection counts when one may drain.
func (p *Proxier) removals(ctx context.Context, vs, want *VirtualServer) ([]ipvsOp, error) {
	var gone []RealServer
	for _, r := range vs.Real {
		if want.realIndex(r.AddrPort()) < 0 {
			gone = append(gone, r)
		}
	}
	drains := func(r RealServer) bool {
		_, serving := slices.BinarySearchFunc(want.serving, r.AddrPort(), netip.AddrPort.Compare)
		return want.Protocol == servicelb.TCP || serving
	}
	var ops []ipvsOp
	if !slices.ContainsFunc(gone, drains) {
		for _, r := range gone {
			ops = append(ops, ipvsOp{kind: delReal, vs: vs, r: r})
		}
		return ops, nil
	}
	info, err := p.k.reals(ctx, vs)
	if err != nil {
		return nil, err
	}
	for _, r := range gone {
		i := slices.IndexFunc(info, func(ri realInfo) bool { return ri.AddrPort() == r.AddrPort() })
		switch {
		case !drains(r) || i < 0 || info[i].active+info[i].inactive == 0:
			ops = append(ops, ipvsOp{kind: delReal, vs: vs, r: r})
		case r.Weight != 0:
			r.Weight = 0
			ops = append(ops, ipvsOp{kind: quiesceReal, vs: vs, r: r})
		default:
			if p.kern.startDrain(vs, r, p.now()) {
				p.log.Debug("ipvs: real server draining", "server", realName(vs, r))
			}
		}
	}
	return ops, nil
}

// deleteServers deletes the virtual servers d removes and returns the
// addresses of those deleted.
func (p *Proxier) deleteServers(ctx context.Context, d *delta, keys []vsKey) ([]netip.Addr, error) {
	var ops []ipvsOp
	for _, k := range keys {
		if have := p.kern.servers[k]; d.servers[k] == nil && have != nil {
			ops = append(ops, ipvsOp{kind: delService, vs: have})
		}
	}
	var addrs []netip.Addr
	for _, o := range ops {
		if o.vs.FWMark == 0 {
			addrs = append(addrs, o.vs.Addr)
		}
	}
	return addrs, p.write(ctx, ops, nil)
}

// deleteAddresses removes from the dummy link the addresses among
// candidates that no virtual server uses any more or that are node
// addresses, and the stray ones when full.
func (p *Proxier) deleteAddresses(ctx context.Context, candidates []netip.Addr, full bool) error {
	slices.SortFunc(candidates, netip.Addr.Compare)
	var del []netip.Prefix
	for _, a := range slices.Compact(candidates) {
		if p.kern.present[a] && (p.kern.use[a] == 0 || p.nodeIP[a]) {
			del = append(del, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	stray := 0
	if full {
		del, stray = append(del, p.kern.stray...), len(p.kern.stray)
	}
	if len(del) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	errs, err := p.k.changeAddresses(ctx, p.link, nil, del)
	for i, pf := range del[:len(del)-stray] {
		if errs[i] == nil {
			delete(p.kern.present, pf.Addr())
		}
	}
	if full && err == nil && firstErrors(errs[len(del)-stray:], nil) == nil {
		p.kern.stray = nil
	}
	return firstErrors(errs, err)
}

// write sends ops to IPVS and records each one that succeeded. It
// returns the errors of those that failed (see tracedErrors): owner names
// the service port each virtual server serves, nil when the ops serve
// none (removals, drains).
func (p *Proxier) write(ctx context.Context, ops []ipvsOp, owner map[vsKey]servicelb.ServicePortKey) error {
	if len(ops) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	errs, err := p.k.write(ctx, ops)
	for i, o := range ops {
		if errs[i] == nil {
			if p.kern.record(o, p.now()) {
				p.log.Debug("ipvs: real server draining", "server", realName(o.vs, o.r))
			}
		}
	}
	return tracedErrors(ops, errs, err, owner)
}

// maxErrors bounds the errors a step reports, of a batch where many
// requests may fail alike.
const maxErrors = 5

// firstErrors joins the first few errors of a batch and the error that
// stopped it, and says how many more failed.
func firstErrors(errs []error, stopped error) error {
	var out []error
	n := 0
	for _, e := range errs {
		if e == nil || errors.Is(e, nl.ErrUnknown) {
			continue
		}
		if n++; n <= maxErrors {
			out = append(out, e)
		}
	}
	if n > maxErrors {
		out = append(out, fmt.Errorf("and %d more requests failed", n-maxErrors))
	}
	return errors.Join(append(out, stopped)...)
}

// tracedErrors joins the errors of a batch of ops (errs, in order) and the
// error that stopped it, as firstErrors does, but for the kernel's
// refusals of ops made for a service port (owner), which it joins by port
// instead, each port's traced to it (syncer.Refused): the sync then leaves
// every such service out at once and applies the rest.
func tracedErrors(ops []ipvsOp, errs []error, stopped error, owner map[vsKey]servicelb.ServicePortKey) error {
	byPort := map[servicelb.ServicePortKey][]error{}
	var ports []servicelb.ServicePortKey
	var rest []error
	for i, e := range errs {
		k := owner[ops[i].vs.key()]
		if e == nil || !isRefusal(e, k) {
			rest = append(rest, e)
			continue
		}
		if byPort[k] == nil {
			ports = append(ports, k)
		}
		byPort[k] = append(byPort[k], e)
	}
	out := make([]error, 0, len(ports)+1)
	for _, k := range ports {
		out = append(out, syncer.Refused(k, firstErrors(byPort[k], nil)))
	}
	return errors.Join(append(out, firstErrors(rest, stopped))...)
}

// isRefusal reports whether err is the kernel's refusal (an errno) of a
// virtual or real server that serves the service port owner. ESRCH is
// none: the virtual server the request names is gone, removed by someone
// else since the proxier last read the kernel, which the next sync reads
// again and repairs; leaving the service out would not.
func isRefusal(err error, owner servicelb.ServicePortKey) bool {
	var errno syscall.Errno
	return owner.Service != "" && errors.As(err, &errno) && errno != syscall.ESRCH
}

// ruleSlot names the rules of one port in one keyed chain: FROM-POD
// (chain 0) or FROM-NODE (chain 1) of a family.
type ruleSlot struct {
	family servicelb.Family
	chain  int
	key    string
}

// delta is a change to the kernel: the virtual servers to make match their
// plan (nil meaning delete), the set entries to add and delete, and the
// rules of ports in the keyed chains to replace (none meaning remove).
type delta struct {
	servers  map[vsKey]*VirtualServer
	add, del []setEntry
	rules    map[ruleSlot][]xtables.Rule
	// full makes the kernel match a whole plan: every address and rule
	// not wanted goes.
	full bool
	// read is set when the kernel's virtual servers were just read, so
	// that every foreign one is known.
	read bool
	// owner names the service port each virtual server added serves.
	owner map[vsKey]servicelb.ServicePortKey
}

// delta returns what the kernel must change for a step of the plan,
// before the step is committed.
func (p *model) delta(s *step) *delta {
	d := &delta{servers: map[vsKey]*VirtualServer{}, rules: map[ruleSlot][]xtables.Rule{},
		owner: map[vsKey]servicelb.ServicePortKey{}}
	counts := map[setEntry]int{}
	slot := func(pp *portPlan, i int) ruleSlot { return ruleSlot{pp.sp.Family, i, pp.key().String()} }
	for _, k := range s.drop {
		pp := p.ports[k]
		if pp == nil {
			continue
		}
		for _, vs := range pp.allServers() {
			d.servers[vs.key()] = nil
		}
		for _, e := range pp.entries {
			counts[e]--
		}
		for i, rs := range pp.rules {
			if len(rs) > 0 {
				d.rules[slot(pp, i)] = nil
			}
		}
	}
	for _, pp := range s.put {
		for _, vs := range pp.allServers() {
			d.servers[vs.key()] = vs
			d.owner[vs.key()] = pp.key()
		}
		for _, e := range pp.entries {
			counts[e]++
		}
		for i, rs := range pp.rules {
			if _, gone := d.rules[slot(pp, i)]; gone || len(rs) > 0 {
				d.rules[slot(pp, i)] = rs
			}
		}
	}
	for e, c := range counts {
		switch before, after := p.entries[e], p.entries[e]+c; {
		case before == 0 && after > 0:
			d.add = append(d.add, e)
		case before > 0 && after == 0:
			d.del = append(d.del, e)
		}
	}
	slices.SortFunc(d.add, compareEntries)
	slices.SortFunc(d.del, compareEntries)
	return d
}

// writes counts the changes sent to the kernel so far.
func (p *Proxier) writes() int { return p.k.writes + p.sets.writes + p.ruleWrites }

// fullDelta returns the delta from what the kernel holds to plan.
func (p *Proxier) fullDelta(plan *model, read bool) *delta {
	d := &delta{servers: map[vsKey]*VirtualServer{}, full: true, read: read, owner: plan.owner}
	for k := range p.kern.servers {
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

func sortedKeys(m map[vsKey]*VirtualServer) []vsKey {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, compareKeys)
	return keys
}
