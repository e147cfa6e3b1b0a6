// Package nodeaddr follows the addresses of a network namespace's
// interfaces, which a node proxy needs to serve node ports on every local
// address of the node, or on those inside some CIDRs, as kube-proxy's
// nodePortAddresses does: feed them to servicelb as NodeConfig.LocalIPs
// (Runner.SetNode), and an address added to an interface serves node ports
// from the next sync on.
//
//	w := nodeaddr.Watcher{Options: nodeaddr.Options{NetNS: ns}}
//	go w.Run(ctx, func(addrs []netip.Addr) {
//		node.LocalIPs = addrs
//		if err := runner.SetNode(node); err != nil { ... }
//	})
//
// The addresses are every unicast address of every interface but the
// excluded ones (an IPVS proxier's dummy link holds service addresses, not
// the node's), without loopback and IPv6 link-local addresses, which
// cannot serve node ports (see servicelb.NodeConfig.LocalhostNodePorts for
// 127.0.0.1).
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
	"golang.org/x/sys/unix"
)

// Options say whose addresses to follow.
type Options struct {
	// NetNS is the node's network namespace; zero means the caller's.
	NetNS netns.NsHandle
	// ExcludeInterfaces names links whose addresses are not the node's.
	ExcludeInterfaces []string
	// Logger receives subscription errors at Warn; nil discards.
	Logger *slog.Logger
}

// List returns the namespace's addresses now, sorted.
func List(o Options) ([]netip.Addr, error) {
	h, err := handle(o.NetNS)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return list(h, o.ExcludeInterfaces)
}

// handle opens a route netlink socket in ns, and no other family: a kernel
// without XFRM or netfilter netlink (a module not loaded) has addresses all
// the same.
func handle(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if ns == 0 {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
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

// Watcher follows the addresses of a namespace. Its zero Options follow
// the caller's namespace.
type Watcher struct {
	Options
	// Settle is how long Run waits for more changes after one before it
	// lists the addresses again; default 100ms, so that an interface
	// brought up with several addresses makes one update.
	Settle time.Duration
	// Retry is the wait before subscribing again after the subscription
	// failed; default 1s.
	Retry time.Duration
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
