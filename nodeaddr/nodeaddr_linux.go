package nodeaddr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// List returns the namespace's addresses now, sorted.
func List(o Options) ([]netip.Addr, error) {
	h, err := handle(o.NetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return list(h, o.ExcludeInterfaces)
}

func handle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns == 0 {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(ns)
	}
	if err != nil {
		return nil, fmt.Errorf("nodeaddr: open netlink: %w", err)
	}
	return h, nil
}

func list(h *netlink.Handle, exclude []string) ([]netip.Addr, error) {
	links, err := h.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, errRetry
	}
	if err != nil {
		return nil, fmt.Errorf("nodeaddr: list links: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		if slices.Contains(exclude, l.Attrs().Name) {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if errors.Is(err, netlink.ErrDumpInterrupted) || isGone(err) {
			return nil, errRetry
		}
		if err != nil {
			return nil, fmt.Errorf("nodeaddr: list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := usable(a.IP); ok {
				out = append(out, ip)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// errRetry: the listing raced with a change; list again.
var errRetry = errors.New("nodeaddr: addresses changed while listed")

func isGone(err error) bool {
	var le netlink.LinkNotFoundError
	return errors.As(err, &le)
}

// usable reports whether ip can serve node ports, as a netip.Addr.
func usable(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	if a.IsLoopback() || a.IsLinkLocalUnicast() && a.Is6() || a.IsMulticast() || a.IsUnspecified() {
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
	h, err := handle(w.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	var last []netip.Addr
	first := true
	refresh := func() error {
		var addrs []netip.Addr
		var err error
		for range 10 {
			if addrs, err = list(h, w.ExcludeInterfaces); !errors.Is(err, errRetry) {
				break
			}
		}
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
		done := make(chan struct{})
		ch := make(chan netlink.AddrUpdate, 64)
		failed := make(chan error, 1)
		ns := w.NetNS
		if ns == 0 {
			ns = netns.None()
		}
		err := netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{
			Namespace: &ns,
			ErrorCallback: func(err error) {
				select {
				case failed <- err:
				default:
				}
			},
		})
		if err == nil {
			// Subscribed first, listed second: no change falls between.
			err = refresh()
			if err != nil && first {
				close(done)
				return err
			}
		}
		if err == nil {
			err = w.follow(ctx, ch, failed, settle, refresh)
		}
		close(done)
		if err != nil && ctx.Err() == nil {
			log.Warn("nodeaddr: address notifications failed; subscribing again", "err", err, "retry", retry)
			sleep(ctx, retry)
		}
	}
	return nil
}

// follow refreshes after each burst of notifications, until ctx ends or
// the subscription fails.
func (w *Watcher) follow(ctx context.Context, ch <-chan netlink.AddrUpdate, failed <-chan error, settle time.Duration, refresh func() error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case _, ok := <-ch:
			if !ok {
				return errors.New("notification channel closed")
			}
		}
		t := time.NewTimer(settle)
	drain:
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-ch:
			case <-t.C:
				break drain
			}
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
