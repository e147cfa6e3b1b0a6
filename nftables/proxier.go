//go:build linux

package nftables

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"syscall"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs one nf_tables table of family inet. It implements
// servicelb.Proxier and servicelb.Renderer. Its methods are safe for
// concurrent use.
type Proxier struct {
	opts Options
	log  *slog.Logger
	plan *planner
	conn *nfnl.Conn
	// ownCT is the conntrack client New opened, closed by Close.
	ownCT *conntrack.Client

	mu  sync.Mutex
	eng *syncer.Engine
	// model is the plan of what the table holds; nil before the first
	// sync.
	model *model
	// gen is the ruleset generation after the Proxier's last commit, and
	// genOK whether nobody committed between that commit and the check
	// before it; seen is the generation the last check read. presumed
	// says that the sync's check took the table on trust (genOK) and read
	// nothing.
	gen, seen       uint32
	genOK, presumed bool
	// use is the number of objects in the table after the last commit.
	use uint32
	// verified is the generation at which a deep verify last found the
	// table whole, when verifiedOK.
	verified   uint32
	verifiedOK bool
	seed       maphash.Seed // for digests of set elements
}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// New returns a Proxier for the options. It opens a netlink socket in the
// target namespace and sends nothing: the first Sync creates or adopts the
// table.
func New(o Options) (*Proxier, error) {
	p, err := newProxier(o)
	if err != nil {
		return nil, err
	}
	o = p.opts
	conn, err := nfnl.Open(nfnl.Options{NetNS: int(o.NetNS)})
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	var ct *conntrack.Client
	if !o.NoConntrackCleanup && o.Conntrack == nil {
		ct, err = conntrack.New(conntrack.Options{NetNS: o.NetNS, Logger: o.Logger})
		if err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("nftables: %w", err)
		}
		o.Conntrack = ct
	}
	p.conn, p.ownCT, p.opts = conn, ct, o
	p.newEngine()
	return p, nil
}

// ForRendering returns a Proxier that renders (Render, Capabilities) and
// opens no socket: for dry runs, and as the packet path of an ebpf Proxier
// made with ebpf.ForRendering. It needs no privileges. Its Sync and
// Cleanup fail with ErrRenderOnly; Close does nothing.
func ForRendering(o Options) (*Proxier, error) { return newProxier(o) }

// newProxier checks the options and applies their defaults; the Proxier it
// returns renders but has no socket yet.
func newProxier(o Options) (*Proxier, error) {
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if !validTableName(o.Table) {
		return nil, fmt.Errorf("nftables: table name %q: %w: use letters, digits and / - _ . after a letter", o.Table, ErrInvalidOptions)
	}
	if o.AffinitySize == 0 {
		o.AffinitySize = DefaultAffinitySize
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxier{opts: o, log: log.With("table", o.Table), plan: newPlanner(o.Table, o.AffinitySize), seed: maphash.MakeSeed()}
	p.newEngine()
	return p, nil
}

// newEngine makes the Engine that runs the Proxier's syncs, with the
// options as they are.
func (p *Proxier) newEngine() {
	o := syncer.Options{Name: "nftables", Logger: p.log, VerifyInterval: p.opts.VerifyInterval, Retryable: nfnl.LostRace,
		Traced: nfnl.RefusedOwners[servicelb.ServicePortKey], Capabilities: p.Capabilities()}
	if !p.opts.NoConntrackCleanup && p.opts.Conntrack != nil {
		o.Cleaner = p.opts.Conntrack
	}
	p.eng = syncer.New((*engine)(p), o)
}

// Close releases the netlink socket. It leaves the table in place (see
// Cleanup).
func (p *Proxier) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eng.Close()
	if p.conn == nil {
		return nil // ForRendering's
	}
	err := p.conn.Close()
	if p.ownCT != nil {
		err = errors.Join(err, p.ownCT.Close())
	}
	return err
}

// Capabilities says what the table can express: every feature, the random
// scheduler (weighted), every protocol, and at most 4095 endpoints per set
// of a service port (the buckets of a load-balancing slot).
func (p *Proxier) Capabilities() servicelb.Capabilities { return capabilities() }

func capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{
		Backend:      "nftables",
		Schedulers:   []servicelb.Scheduler{servicelb.SchedulerRandom},
		MaxEndpoints: buckets,
		Features:     servicelb.AllFeatures &^ servicelb.FeatureLocalhostNodePorts,
	}
}

// Render returns the table st would produce, as nft text that `nft -f`
// loads. It needs no privileges and does not touch the kernel.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	caps, node := p.Capabilities(), st.Node()
	if err := caps.CheckNode(&node); err != nil {
		return "", err
	}
	m, err := p.plan.build(st)
	if err != nil {
		return "", err
	}
	return p.plan.content(m).render(p.opts.Table), nil
}

// Cleanup deletes the table, and nothing else. A later Sync creates it
// again.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.eng.Closed() {
		return ErrClosed
	}
	if p.conn == nil {
		return ErrRenderOnly
	}
	p.eng.Forget()
	p.model, p.genOK, p.verifiedOK = nil, false, false
	if _, err := p.conn.Table(ctx, nfnl.Inet, p.opts.Table); errors.Is(err, nfnl.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("nftables: cleanup: %w", err)
	}
	// Two transactions: the rules, then the rest. A packet that is
	// going through the rules when a transaction commits reads them as
	// they were, but the sets and maps as they are: had one transaction
	// deleted both, the dispatch map would already be empty to it while
	// the rule rejecting what it does not dispatch still read a full set
	// of cluster IPs, and the packet, which either table would have
	// translated or left to whatever serves after, would be rejected.
	// Between the two, every packet reading the rules of before has gone
	// through (nfnl.AwaitReaders): one that read them before the first
	// commit and looked up the maps after the second (held that long by
	// a busy host's scheduler, say) would meet the same mix.
	for i, del := range []func(*nfnl.Batch){
		func(b *nfnl.Batch) { b.FlushTable(nfnl.Inet, p.opts.Table) },
		func(b *nfnl.Batch) { b.DelTable(nfnl.Inet, p.opts.Table) },
	} {
		if i > 0 {
			nfnl.AwaitReaders()
		}
		var b nfnl.Batch
		del(&b)
		// ENOENT: someone deleted the table since we looked.
		if _, err := p.conn.Commit(ctx, &b); errors.Is(err, syscall.ENOENT) {
			break
		} else if err != nil {
			return fmt.Errorf("nftables: cleanup: %w", err)
		}
	}
	p.log.Info("table deleted")
	return nil
}

// Sync makes the table match st. See the package documentation for what
// it writes and when.
func (p *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil && !p.eng.Closed() {
		return servicelb.SyncReport{}, fmt.Errorf("nftables: sync: %w", ErrRenderOnly)
	}
	return p.eng.Sync(ctx, st)
}
