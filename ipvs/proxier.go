//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/ipset"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs IPVS in one network namespace. It implements
// servicelb.Proxier and servicelb.Renderer. Its methods may be called
// concurrently: they are serialised.
type Proxier struct {
	opts Options
	log  *slog.Logger
	ns   netns.NsHandle
	now  func() time.Time
	// renderOnly is set by ForRendering: no socket, no engine.
	renderOnly bool

	mu     sync.Mutex
	k      *kernel
	closed bool
	eng    *syncer.Engine
	// plan is the plan of the state last applied: what the kernel holds;
	// nil means the next sync reads the kernel and converges from what it
	// finds.
	model *model
	// link is the dummy link as last seen; its Index is 0 when unknown
	// or missing.
	link rtnl.Link
	// kern is what the kernel holds of the proxier's own.
	kern mirror
	// nodeIP are the node's addresses, which stay off the dummy link.
	nodeIP map[netip.Addr]bool
	// sets are the helper sets.
	sets *sets
	// cleaner deletes stale flows: Options.Conntrack, or conntrack, a
	// client the proxier opened itself; nil with NoConntrackCleanup.
	cleaner   conntrack.FlowCleaner
	conntrack *conntrack.Client
	// rules keeps the helper rules through rconn.
	rules      *xtables.Applier
	rconn      *nfnl.Conn
	ruleWrites int
}

// realKey names one real server of one virtual server.
type realKey struct {
	vs vsKey
	ap netip.AddrPort
}

// New returns a Proxier for the namespace o.NetNS. It checks that the
// kernel has IPVS (ErrIPVSUnavailable otherwise) and opens netlink sockets
// there, but changes nothing until Sync. Close releases it. Opening them
// needs CAP_NET_ADMIN, and CAP_SYS_ADMIN only to enter a namespace other
// than the calling thread's: without them the error wraps
// servicelb.ErrPermission and names what is missing.
func New(o Options) (_ *Proxier, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("ipvs: %w", privilege.Check(err))
		}
	}()
	o, err = o.withDefaults()
	if err != nil {
		return nil, err
	}
	// The sockets are opened on this thread: in its namespace, without
	// entering it, when that is the target.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ns, err := dupNS(o.NetNS)
	if err != nil {
		return nil, err
	}
	at, err := socketNS(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return open(o, ns, at)
}

// ForRendering returns a Proxier for o that holds no socket and needs no
// privilege or IPVS: its Render and Capabilities answer as New's would
// (Options.StrictARP included), and its Sync and Cleanup return
// ErrRenderOnly. A dry run renders with it where IPVS may be missing.
func ForRendering(o Options) (*Proxier, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("ipvs: %w", err)
	}
	return &Proxier{opts: o, renderOnly: true}, nil
}

// socketNS returns the handle the proxier's sockets are opened with:
// netns.None(), the calling thread's namespace, when ns is that one, so
// that no setns (and no CAP_SYS_ADMIN) is needed; else ns. It checks the
// capabilities that takes.
func socketNS(ns netns.NsHandle) (netns.NsHandle, error) {
	own, err := nsutil.Own(ns)
	if err != nil {
		return netns.None(), opErr("open current network namespace", "", err)
	}
	if err := privilege.Require("programming IPVS", privilege.NetAdmin); err != nil {
		return netns.None(), err
	}
	if own {
		return netns.None(), nil
	}
	return ns, privilege.Require("entering another network namespace", privilege.SysAdmin)
}

// open opens the proxier's sockets with the handle at (netns.None() for
// the calling thread's namespace). ns is the proxier's own handle of its
// namespace, which it keeps, and closes when it fails.
func open(o Options, ns, at netns.NsHandle) (*Proxier, error) {
	// New takes no context: the lookup of IPVS's netlink family is one
	// round trip to the kernel.
	k, err := openKernel(context.Background(), at, o.Interface)
	if err != nil {
		ns.Close()
		return nil, err
	}
	p := &Proxier{opts: o, log: o.Logger, ns: ns, now: time.Now, k: k, kern: newMirror()}
	fail := func(err error) (*Proxier, error) {
		p.closeAll()
		return nil, err
	}
	c, err := ipset.New(ipset.Options{NetNS: at, Prefix: o.SetPrefix, Logger: o.Logger})
	if err != nil {
		return fail(fmt.Errorf("helper sets: %w", err))
	}
	p.sets = &sets{c: c}
	if p.rconn, err = nfnl.Open(nfnl.Options{NetNS: int(at)}); err != nil {
		return fail(fmt.Errorf("helper rules: %w", err))
	}
	p.rules = xtables.NewApplier(xtables.ApplierOptions{Conn: p.rconn, Owns: ownsChain(o.ChainPrefix), Logger: o.Logger})
	p.cleaner = o.Conntrack
	if o.NoConntrackCleanup {
		p.cleaner = nil
	} else if p.cleaner == nil {
		ct, err := conntrack.New(conntrack.Options{NetNS: at, Logger: o.Logger})
		if err != nil {
			return fail(err)
		}
		p.cleaner, p.conntrack = ct, ct
	}
	eo := syncer.Options{Name: "ipvs", Logger: p.log, VerifyInterval: o.VerifyInterval, Retryable: nfnl.LostRace, After: p.drain,
		Capabilities: p.Capabilities()}
	if p.cleaner != nil {
		eo.Cleaner = p.cleaner
	}
	p.eng = syncer.New((*engine)(p), eo)
	return p, nil
}

// closeAll releases what New opened.
func (p *Proxier) closeAll() error {
	var errs []error
	p.k.close()
	if p.sets != nil {
		errs = append(errs, p.sets.c.Close())
	}
	if p.conntrack != nil {
		errs = append(errs, p.conntrack.Close())
	}
	if p.rconn != nil {
		errs = append(errs, p.rconn.Close())
	}
	return errors.Join(append(errs, p.ns.Close())...)
}

// dupNS returns a handle of its own to ns, or to the calling thread's
// namespace when ns is not set.
func dupNS(ns netns.NsHandle) (netns.NsHandle, error) {
	if ns == 0 || ns == netns.None() {
		h, err := netns.Get()
		if err != nil {
			return netns.None(), opErr("open current network namespace", "", err)
		}
		return h, nil
	}
	h, err := netns.GetFromPath(fmt.Sprintf("/proc/self/fd/%d", int(ns)))
	if err != nil {
		return netns.None(), fmt.Errorf("%w: NetNS: %v", ErrInvalidOptions, err)
	}
	return h, nil
}

// Close releases the proxier's sockets and namespace handle. The kernel
// state stays: a later Proxier with the same options adopts it.
func (p *Proxier) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.renderOnly {
		return nil
	}
	p.eng.Close()
	return p.closeAll()
}

// Render returns the kernel state Sync installs for st; see the
// package-level Render.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	return Render(st, p.opts)
}

// Capabilities returns what the proxier expresses: every feature but
// affinity expiry, node ports on localhost, lingering flows and, without
// Options.StrictARP, servicelb.FeatureNoARPAnswers; the IPVS schedulers (rr,
// wrr, lc, wlc, sh, dh, sed, nq, mh) and every protocol.
func (p *Proxier) Capabilities() servicelb.Capabilities { return capabilities(&p.opts) }

var _ servicelb.Proxier = (*Proxier)(nil)
var _ servicelb.Renderer = (*Proxier)(nil)

// errIf returns ErrClosed once the proxier is closed; p.mu is held.
func (p *Proxier) errIf() error {
	if p.closed {
		return ErrClosed
	}
	if p.renderOnly {
		return ErrRenderOnly
	}
	return nil
}

// forget makes the next Sync read the kernel again.
func (p *Proxier) forget() {
	p.model, p.link = nil, rtnl.Link{}
}

// Cleanup removes everything the proxier owns: its virtual servers (those
// on the dummy link's addresses, those its sets record and the
// firewall-mark ones of its marks), the dummy link,
// and its helper sets and rules. It works without a previous Sync, so a new
// Proxier can clean up after an old one.
func (p *Proxier) Cleanup(ctx context.Context) error {
	if err := p.cleanup(ctx); err != nil {
		return fmt.Errorf("ipvs: cleanup: %w", err)
	}
	p.log.Info("ipvs: cleaned up", "interface", p.opts.Interface)
	return nil
}

func (p *Proxier) cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.errIf(); err != nil {
		return err
	}
	p.forget()
	p.eng.Forget()
	p.kern.forget()
	if err := p.cleanupServers(ctx); err != nil {
		return err
	}
	if err := p.k.removeDummy(ctx); err != nil {
		return err
	}
	if err := p.rules.Cleanup(ctx, ruleTables()); err != nil {
		return fmt.Errorf("helper rules: %w", err)
	}
	if err := p.sets.cleanup(ctx); err != nil {
		return err
	}
	return nil
}

// cleanupServers deletes the proxier's virtual servers.
func (p *Proxier) cleanupServers(ctx context.Context) error {
	ours := map[netip.Addr]bool{}
	l, ok, err := p.k.dummy(ctx)
	if err != nil {
		return err
	}
	if ok {
		prefixes, err := p.k.addresses(ctx, l)
		if err != nil {
			return err
		}
		for _, pf := range prefixes {
			ours[pf.Addr()] = true
		}
	}
	if err := p.sets.load(ctx); err != nil {
		return err
	}
	servers, err := p.k.services(ctx)
	if err != nil {
		return err
	}
	var ops []ipvsOp
	for _, vs := range servers {
		if p.owns(vs, ours) {
			ops = append(ops, ipvsOp{kind: delService, vs: vs})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	errs, err := p.k.write(ctx, ops)
	return firstErrors(errs, err)
}

// owns reports whether a virtual server is the proxier's: an address one
// on an address of its dummy link or recorded in its sets, a firewall-mark
// one with a mark of Options.FWMarkMask.
func (p *Proxier) owns(vs *VirtualServer, onLink map[netip.Addr]bool) bool {
	if vs.FWMark != 0 {
		return markSpace{p.opts.FWMarkMask}.owns(vs.FWMark)
	}
	return onLink[vs.Addr] || p.sets.recorded(vs.key())
}

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
