package nodeaddr

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
)

// List returns the namespace's addresses now, sorted.
func List(o Options) ([]netip.Addr, error) {
	c, err := open(o.NetNS)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return list(context.Background(), c, o.ExcludeInterfaces)
}

// open opens a route netlink socket in ns (zero: the caller's namespace).
func open(ns netns.NsHandle) (*rtnl.Conn, error) {
	c, err := rtnl.Open(ns)
	if err != nil {
		return nil, fmt.Errorf("nodeaddr: open netlink: %w", err)
	}
	return c, nil
}

// list reads every address of the namespace, in one dump, and keeps those
// of links not excluded (their indexes read in a dump of the links
// before) that can serve node ports. A link added or renamed between the
// two dumps comes with address notifications that make a follower list
// again.
func list(ctx context.Context, c *rtnl.Conn, exclude []string) ([]netip.Addr, error) {
	excluded := map[int]bool{}
	if len(exclude) > 0 {
		links, err := c.Links(ctx)
		if err != nil {
			return nil, fmt.Errorf("nodeaddr: %w", err)
		}
		for _, l := range links {
			if slices.Contains(exclude, l.Name) {
				excluded[l.Index] = true
			}
		}
	}
	addrs, err := c.AllAddrs(ctx)
	if err != nil {
		return nil, fmt.Errorf("nodeaddr: list addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := usable(a.Prefix.Addr()); ok && !excluded[a.Link] {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// usable reports whether a can serve node ports, unmapped.
func usable(a netip.Addr) (netip.Addr, bool) {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() && a.Is6() || a.IsMulticast() || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a, true
}

// Run calls update with the namespace's addresses at once and again
// whenever they change, until ctx ends; then it returns nil. It follows
// the kernel's address notifications, and subscribes again (listing
// afresh) when the subscription fails, so it runs as long as ctx does. It
// returns an error only when it cannot list the addresses at the start.
func (w *Watcher) Run(ctx context.Context, update func([]netip.Addr)) error {
	settle, retry := cmpOr(w.Settle, 100*time.Millisecond), cmpOr(w.Retry, time.Second)
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := open(w.NetNS)
	if err != nil {
		return err
	}
	defer c.Close()
	var last []netip.Addr
	first := true
	refresh := func() error {
		addrs, err := list(ctx, c, w.ExcludeInterfaces)
		if err != nil {
			return err
		}
		if first || !slices.Equal(addrs, last) {
			first, last = false, addrs
			update(slices.Clone(addrs))
		}
		return nil
	}
	for ctx.Err() == nil {
		events, err := rtnl.WatchAddrs(w.NetNS)
		if err == nil {
			// Subscribed first, listed second: no change falls between.
			err = refresh()
			if err != nil && first {
				events.Close()
				return err
			}
			if err == nil {
				err = w.follow(ctx, events, settle, refresh)
			}
			events.Close()
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("nodeaddr: address notifications failed; subscribing again", "err", err, "retry", retry)
			sleep(ctx, retry)
		}
	}
	return nil
}

// follow refreshes after each burst of notifications, until ctx ends or
// the subscription fails.
func (w *Watcher) follow(ctx context.Context, events *rtnl.AddrEvents, settle time.Duration, refresh func() error) error {
	for {
		if err := events.Next(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		// The rest of the burst.
		burst, cancel := context.WithTimeout(ctx, settle)
		for events.Next(burst) == nil {
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err := refresh(); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
