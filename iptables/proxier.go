//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier programs kube-proxy's iptables layout into the iptables-nft
// tables of one network namespace. See the package documentation.
type Proxier struct {
	mu   sync.Mutex
	opts Options
	n    names
	conn xtables.Conn
	ap   *xtables.Applier
	eng  *syncer.Engine
	log  *slog.Logger
	ct   *conntrack.Client // opened by New unless NoConntrackCleanup or Conntrack
}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// ForRendering returns a Proxier that renders (Render, RenderFamily,
// Capabilities) and opens no socket: for dry runs. It needs no
// privileges. Its Sync and Cleanup fail with ErrRenderOnly; Close does
// nothing.
func ForRendering(o Options) (*Proxier, error) {
	if err := o.normalize(); err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return &Proxier{opts: o, n: names{prefix: o.ChainPrefix}, log: o.Logger}, nil
}

// New returns a Proxier. It opens a netlink socket in the target
// namespace and reads nothing until the first Sync.
func New(o Options) (*Proxier, error) {
	if err := o.normalize(); err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	px := &Proxier{opts: o, n: names{prefix: o.ChainPrefix}, log: o.Logger}
	if c, ok := o.conn.(xtables.Conn); ok {
		px.conn = c
	} else {
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
	eo := syncer.Options{Name: "iptables", Logger: o.Logger, VerifyInterval: o.VerifyInterval, Retryable: nfnl.LostRace,
		Traced: nfnl.RefusedOwners[servicelb.ServicePortKey], Capabilities: px.Capabilities()}
	if px.opts.Conntrack != nil {
		eo.Cleaner = px.opts.Conntrack
	}
	px.eng = syncer.New((*engine)(px), eo)
	return px, nil
}

// Close releases the netlink sockets. The kernel state stays.
func (px *Proxier) Close() error {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.eng != nil { // nil when New failed part way
		if px.eng.Closed() {
			return nil
		}
		px.eng.Close()
	}
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
// TCP, UDP and SCTP, any number of endpoints, and every feature, in the
// families of Options.Families.
func (px *Proxier) Capabilities() servicelb.Capabilities {
	return servicelb.Capabilities{
		Backend:    "iptables",
		Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom},
		Features:   servicelb.AllFeatures,
		Families:   slices.Clone(px.opts.Families),
	}
}

// Sync makes the kernel match st. The first Sync reads what the kernel
// holds and writes only what differs, so that a restarted agent takes
// over without disturbing traffic. Later ones send only the changes since
// the last successful Sync, after checking cheaply that nobody removed
// what the Proxier owns, and now and then in depth (Options.
// VerifyInterval); what someone else changed is repaired. Each sync is
// one nf_tables transaction: a failed Sync changes nothing. A service
// port the Proxier's capabilities refuse fails the Sync with servicelb's
// error (ErrUnsupported) before anything is sent.
func (px *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.eng == nil {
		return servicelb.SyncReport{}, fmt.Errorf("iptables: sync: %w", ErrRenderOnly)
	}
	return px.eng.Sync(ctx, st)
}

// Cleanup removes every chain the Proxier owns and its rules in the
// builtin chains. Tables and builtin chains stay, as do foreign chains and
// rules.
func (px *Proxier) Cleanup(ctx context.Context) error {
	px.mu.Lock()
	defer px.mu.Unlock()
	if px.eng == nil {
		return ErrRenderOnly
	}
	if px.eng.Closed() {
		return fmt.Errorf("iptables: cleanup: %w", ErrClosed)
	}
	var tables []xtables.Table
	for _, f := range px.opts.Families {
		nat, filter := familyTables(f)
		tables = append(tables, filter, nat)
	}
	px.eng.Forget()
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
