package conntrack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// MaxAttempts bounds how often one call dumps a family's table when the
// kernel reports the dump as interrupted by concurrent changes.
const MaxAttempts = 4

// Options configure a Client.
type Options struct {
	// NetNS is the network namespace whose conntrack table the client
	// reads and changes. Zero (and netns.None()) mean the namespace of the
	// thread that calls New, normally the process's own. The client opens
	// its netlink socket in the namespace in New and keeps no reference to
	// the handle: the caller may close it afterwards.
	NetNS netns.NsHandle
	// Logger receives the client's log; nil discards it.
	Logger *slog.Logger
}

// table is the client's access to the kernel: a ctnetlink socket, or a
// fake in tests.
type table interface {
	// dump lists a family's flows; with errInterrupted the list is
	// complete but may be inconsistent.
	dump(ctx context.Context, fam uint8) ([]entry, error)
	// remove deletes one dumped flow.
	remove(ctx context.Context, fam uint8, e entry) error
	close() error
}

// FlowCleaner deletes the conntrack flows that stale-flow filters select,
// and returns how many it deleted. *Client implements it; the proxiers take
// one in their options.
type FlowCleaner interface {
	DeleteStale(ctx context.Context, filters []servicelb.StaleFlow) (int, error)
}

var _ FlowCleaner = (*Client)(nil)

// Client lists and deletes conntrack flows of one network namespace
// through netlink. It is safe for concurrent use; calls are serialised.
type Client struct {
	mu  sync.Mutex
	t   table
	log *slog.Logger
}

// New opens a netlink socket in the namespace o.NetNS.
func New(o Options) (*Client, error) {
	ns := o.NetNS
	if ns < 0 {
		ns = 0 // netns.None(): the caller's namespace, as zero
	}
	c, err := nl.Open(netlinkNetfilter, nl.Options{NetNS: int(ns)})
	if err != nil {
		return nil, fmt.Errorf("conntrack: %w", err)
	}
	return newClient(&ctTable{c: c}, o.Logger), nil
}

func newClient(t table, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{t: t, log: log}
}

// Close closes the client's socket.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t == nil {
		return nil
	}
	err := c.t.close()
	c.t = nil
	if err != nil {
		return fmt.Errorf("conntrack: close: %w", err)
	}
	return nil
}

func inetFamily(f servicelb.Family) (uint8, error) {
	switch f {
	case servicelb.IPv4:
		return afInet, nil
	case servicelb.IPv6:
		return afInet6, nil
	}
	return 0, fmt.Errorf("%w: %v", ErrInvalidFamily, f)
}

// begin locks the client, unless ctx has ended; its kernel calls are
// bounded by ctx, whose end interrupts a call under way. The caller must
// call the returned function.
func (c *Client) begin(ctx context.Context) (func(), error) {
	c.mu.Lock()
	if c.t == nil {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	return c.mu.Unlock, nil
}

// List returns every flow of family f.
func (c *Client) List(ctx context.Context, f servicelb.Family) ([]Flow, error) {
	fam, err := inetFamily(f)
	if err != nil {
		return nil, &OpError{Op: "list", Family: f, Err: err}
	}
	end, err := c.begin(ctx)
	if err != nil {
		return nil, &OpError{Op: "list", Family: f, Err: err}
	}
	defer end()
	for attempt := 1; ; attempt++ {
		entries, err := c.t.dump(ctx, fam)
		if errors.Is(err, errInterrupted) {
			if attempt < MaxAttempts {
				c.log.Debug("conntrack dump interrupted, retrying", "family", f, "attempt", attempt)
				continue
			}
			err = fmt.Errorf("%w after %d attempts", ErrDumpInterrupted, attempt)
		}
		if err != nil {
			return nil, &OpError{Op: "list", Family: f, Err: errors.Join(ctx.Err(), err)}
		}
		out := make([]Flow, 0, len(entries))
		for _, e := range entries {
			out = append(out, e.flow)
		}
		return out, nil
	}
}

// DeleteStale deletes the flows that any of the stale-flow filters
// selects (see Flow.Matches), and returns how many it deleted. It reads
// each family's table once per call, however many filters there are, and
// matches each flow against all filters in constant time. Given a State's
// StaleFlows, it reconciles the whole table with the state, as
// kube-proxy's CleanStaleEntries does; given a Diff's, only the frontends
// that changed. Invalid filters are reported as a *StaleFlowError before
// anything is deleted.
func (c *Client) DeleteStale(ctx context.Context, stale []servicelb.StaleFlow) (int, error) {
	idx, err := buildIndex(stale)
	if err != nil {
		return 0, err
	}
	if len(idx) == 0 {
		return 0, nil
	}
	end, err := c.begin(ctx)
	if err != nil {
		return 0, &OpError{Op: "delete stale", Err: err}
	}
	defer end()
	total := 0
	var errs []error
	for _, f := range []servicelb.Family{servicelb.IPv4, servicelb.IPv6} {
		if idx[f] == nil {
			continue
		}
		n, err := c.deleteFamily(ctx, f, idx[f])
		total += n
		if err != nil {
			errs = append(errs, &OpError{Op: "delete stale", Family: f, Err: err})
		}
	}
	if total > 0 {
		c.log.Debug("deleted stale conntrack flows", "flows", total, "filters", len(stale))
	}
	return total, errors.Join(errs...)
}

// deleteFamily runs one dump-and-delete pass over a family's table, and
// more only when the kernel reports the dump as interrupted.
func (c *Client) deleteFamily(ctx context.Context, f servicelb.Family, ix index) (int, error) {
	fam, _ := inetFamily(f)
	total := 0
	var failures []error
	for attempt := 1; ; attempt++ {
		entries, err := c.t.dump(ctx, fam)
		interrupted := errors.Is(err, errInterrupted)
		if err != nil && !interrupted {
			return total, errors.Join(append(failures, ctx.Err(), err)...)
		}
		n, errs := c.removeMatching(ctx, fam, ix, entries)
		total += n
		failures = append(failures, errs...)
		c.log.Debug("conntrack delete pass", "family", f, "flows", len(entries), "deleted", n, "attempt", attempt)
		if !interrupted || ctx.Err() != nil {
			return total, errors.Join(append(failures, ctx.Err())...)
		}
		if attempt == MaxAttempts {
			failures = append(failures, fmt.Errorf("%w after %d attempts", ErrDumpInterrupted, attempt))
			return total, errors.Join(failures...)
		}
	}
}

// removeMatching deletes the dumped flows the index matches. A flow that
// is already gone counts as deleted.
func (c *Client) removeMatching(ctx context.Context, fam uint8, ix index, entries []entry) (int, []error) {
	n := 0
	var errs []error
	for _, e := range entries {
		if !ix.matches(e.flow.Protocol, e.flow.Orig.Dst, e.flow.Reply.Src) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if err := c.t.remove(ctx, fam, e); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("delete %s: %w", e.flow, err))
			continue
		}
		n++
	}
	return n, errs
}
