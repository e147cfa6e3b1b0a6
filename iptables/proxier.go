package iptables

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs kube-proxy's iptables layout into the iptables-nft
// tables of one network namespace. See the package documentation.
type Proxier struct {
	mu      sync.Mutex
	opts    Options
	n       names
	conn    xtables.Conn
	ap      *xtables.Applier
	applied *servicelb.State
	log     *slog.Logger
	ct      *conntrack.Client // opened by New unless NoConntrackCleanup or Conntrack
	// lastFull is when the last full reconcile succeeded.
	lastFull time.Time
	// stale holds the stale-flow filters still to delete, by frontend.
	stale map[flowKey]servicelb.StaleFlow
}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// New returns a Proxier. It opens a netlink socket in the target
// namespace and reads nothing until the first Sync.
func New(o Options) (*Proxier, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	px := &Proxier{opts: o, n: names{prefix: o.ChainPrefix}, conn: o.conn, log: o.Logger}
	if px.conn == nil {
		c, err := nfnl.Open(nfnl.Options{NetNS: int(o.NetNS)})
		if err != nil {
			return nil, fmt.Errorf("iptables: %w", err)
		}
		px.conn = c
	}
	if o.NoConntrackCleanup {
		px.opts.Conntrack = nil
	} else if o.Conntrack == nil {
		ct, err := conntrack.New(conntrack.Options{NetNS: o.NetNS, Logger: o.Logger})
		if err != nil {
			px.Close()
			return nil, fmt.Errorf("iptables: %w", err)
		}
		px.opts.Conntrack, px.ct = ct, ct
	}
	px.ap = xtables.NewApplier(xtables.ApplierOptions{
		Conn:   px.conn,
		Owns:   func(_ xtables.TableName, chain string) bool { return px.n.owns(chain) },
		Logger: o.Logger,
	})
	return px, nil
}

// Close releases the netlink sockets. The kernel state stays.
func (px *Proxier) Close() error {
	var errs []error
	if c, ok := px.conn.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	if px.ct != nil {
		errs = append(errs, px.ct.Close())
	}
	return errors.Join(errs...)
}

// Capabilities says what the Proxier expresses: random spreading in
// proportion to the endpoints' weights (the default hint and "random"),
// TCP, UDP and SCTP, any number of endpoints, and every feature.
func (px *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{
		Backend:    "iptables",
		Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom},
		Features:   servicelb.AllFeatures,
	}
}

// Sync makes the kernel match st. The first Sync reads what the kernel
// holds and writes only what differs, so that a restarted agent takes
// over without disturbing traffic. Later ones send only the changes since
// the last successful Sync, after checking cheaply that nobody removed
// what the Proxier owns (and repairing it if someone did). Each sync is
// one nf_tables transaction: a failed Sync changes nothing. A service
// port the Proxier's capabilities refuse fails the Sync with
// servicelb's error (ErrUnsupported) before anything is sent.
func (px *Proxier) Sync(ctx context.Context, st *servicelb.State) error {
	if st == nil {
		return errors.New("iptables: sync: nil state")
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	prev := px.applied
	var ch servicelb.Changes
	if prev != nil {
		// The other ports were checked when they were applied.
		ch = servicelb.Diff(prev, st)
		if err := px.checkChanges(&ch); err != nil {
			return err
		}
	} else if err := px.checkPorts(st.Ports()...); err != nil {
		return err
	}
	full, err := px.needFull(ctx, prev, &ch)
	if err != nil {
		return fmt.Errorf("iptables: sync: %w", err)
	}
	switch {
	case full:
		err = px.reconcile(ctx, st)
	case !ch.Empty():
		full, err = px.commit(ctx, st, &ch)
	}
	if err != nil {
		return fmt.Errorf("iptables: sync: %w", err)
	}
	px.applied = st
	px.queueStale(st, &ch, full)
	return px.clearStale(ctx)
}

// checkChanges checks the ports that changes add or change.
func (px *Proxier) checkChanges(ch *servicelb.Changes) error {
	for _, c := range ch.Changed {
		if err := px.checkPorts(c.New); err != nil {
			return err
		}
	}
	return px.checkPorts(ch.Added...)
}

// flowKey is the frontend a stale-flow filter is for.
type flowKey struct {
	proto servicelb.Protocol
	dst   netip.Addr
	port  uint16
}

// queueStale adds the stale-flow filters of a successful sync to those
// still to delete: one for each frontend the changes touched and, after a
// full reconcile (the first sync, a repair), one for every UDP and SCTP
// frontend of the state, which reconciles the whole conntrack table with
// it. A filter replaces an older one for the same frontend, whose
// serving endpoints may have changed since.
func (px *Proxier) queueStale(st *servicelb.State, ch *servicelb.Changes, full bool) {
	if px.opts.Conntrack == nil {
		return
	}
	if px.stale == nil {
		px.stale = map[flowKey]servicelb.StaleFlow{}
	}
	add := func(flows []servicelb.StaleFlow) {
		for _, f := range flows {
			px.stale[flowKey{f.Protocol, f.Dst, f.Port}] = f
		}
	}
	add(ch.StaleFlows())
	if full {
		add(st.StaleFlows())
	}
}

// clearStale deletes the conntrack flows the queued filters select. The
// filters stay queued until a deletion succeeds, so that a failure is
// retried by the next Sync.
func (px *Proxier) clearStale(ctx context.Context) error {
	if len(px.stale) == 0 {
		return nil
	}
	flows := slices.SortedFunc(maps.Values(px.stale), func(a, b servicelb.StaleFlow) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), a.Dst.Compare(b.Dst), cmp.Compare(a.Port, b.Port))
	})
	n, err := px.opts.Conntrack.DeleteStale(ctx, flows)
	if err != nil {
		return fmt.Errorf("iptables: sync applied; deleting the stale flows of %d frontends, retried on the next sync: %w", len(flows), err)
	}
	clear(px.stale)
	px.log.Debug("deleted stale flows", "frontends", len(flows), "flows", n)
	return nil
}

// needFull reports whether the sync must reconcile the whole state: on
// the first sync, after a failure, after a node change, or when someone
// else changed what the Proxier owns.
func (px *Proxier) needFull(ctx context.Context, prev *servicelb.State, ch *servicelb.Changes) (bool, error) {
	if prev == nil || !px.ap.Loaded() || ch.NodeChanged {
		return true, nil
	}
	if i := px.opts.FullResyncInterval; i > 0 && time.Since(px.lastFull) >= i {
		px.log.Debug("full check of the tables", "last", px.lastFull)
		return true, nil
	}
	ok, err := px.ap.Check(ctx)
	if err != nil {
		return false, err
	}
	if !ok {
		px.log.Info("tables changed by someone else; repairing")
	}
	return !ok, nil
}

func (px *Proxier) reconcile(ctx context.Context, st *servicelb.State) error {
	want, err := px.content(st)
	if err != nil {
		return err
	}
	stats, err := px.ap.Reconcile(ctx, want)
	if err != nil {
		return err
	}
	px.lastFull = time.Now()
	px.log.Debug("reconciled", "services", st.Len(), "messages", stats.Messages, "bytes", stats.Bytes)
	return nil
}

// commit applies the changes in one batch. When someone else changed the
// tables meanwhile it reconciles the whole state instead, and reports
// that it did.
func (px *Proxier) commit(ctx context.Context, st *servicelb.State, ch *servicelb.Changes) (full bool, err error) {
	tx := xtables.NewTx()
	if err := px.changes(st, ch, tx); err != nil {
		return false, err
	}
	stats, err := px.ap.Commit(ctx, tx)
	if errors.Is(err, xtables.ErrGenChanged) {
		px.log.Info("tables changed by someone else during the sync; repairing")
		return true, px.reconcile(ctx, st)
	}
	if err != nil {
		return false, err
	}
	px.log.Debug("committed", "ports", ch.Len(), "messages", stats.Messages, "bytes", stats.Bytes)
	return false, nil
}

// Cleanup removes every chain the Proxier owns and its rules in the
// builtin chains. Tables and builtin chains stay, as do foreign chains and
// rules.
func (px *Proxier) Cleanup(ctx context.Context) error {
	px.mu.Lock()
	defer px.mu.Unlock()
	var tables []xtables.Table
	for _, f := range px.opts.Families {
		nat, filter := familyTables(f)
		tables = append(tables, filter, nat)
	}
	px.applied = nil
	clear(px.stale)
	if err := px.ap.Cleanup(ctx, tables); err != nil {
		return fmt.Errorf("iptables: cleanup: %w", err)
	}
	return nil
}

// Render returns the rules st gives, as iptables-save prints them: for
// each family, the filter and nat tables with their builtin chains (only
// the Proxier's rules in them) and the Proxier's chains. With both
// families, the IPv4 text comes first and each is introduced by a comment
// line; use RenderFamily for input to iptables-restore.
func (px *Proxier) Render(st *servicelb.State) (string, error) {
	var b strings.Builder
	for _, f := range px.opts.Families {
		text, err := px.RenderFamily(st, f)
		if err != nil {
			return "", err
		}
		if len(px.opts.Families) > 1 {
			fmt.Fprintf(&b, "# %s\n", map[servicelb.Family]string{servicelb.IPv4: "iptables-save", servicelb.IPv6: "ip6tables-save"}[f])
		}
		b.WriteString(text)
	}
	return b.String(), nil
}

// RenderFamily returns the rules of one family as iptables-save (or
// ip6tables-save) prints them.
func (px *Proxier) RenderFamily(st *servicelb.State, f servicelb.Family) (string, error) {
	want, err := px.content(st)
	if err != nil {
		return "", err
	}
	return renderFamily(want, f)
}

// renderFamily returns one family's tables as iptables-save prints them.
func renderFamily(want map[xtables.Table]*xtables.TableContent, f servicelb.Family) (string, error) {
	nat, filter := familyTables(f)
	if want[nat] == nil {
		return "", fmt.Errorf("iptables: render: family %s is not programmed", f)
	}
	b := xtables.AppendSaveTable(nil, nat.Family, want[filter].Text(xtables.Filter))
	b = xtables.AppendSaveTable(b, nat.Family, want[nat].Text(xtables.NAT))
	return string(b), nil
}
