//go:build linux

package netnstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
)

// neighPoll is how often Resolve reads the neighbour table.
const neighPoll = 20 * time.Millisecond

// Resolve asks, as a neighbour on the host's link (Link) would, which
// machine claims each address: it routes the addresses onto the link,
// with no gateway, sends one datagram to each so that the kernel solicits
// its link-layer address (ARP for IPv4, neighbour discovery for IPv6), and
// returns the link-layer address that answered for each within wait; an
// address nobody answered for is absent. The routes and neighbour entries
// are removed before it returns. An answer ends the wait for its address;
// silence costs the whole wait.
func (h *Host) Resolve(ctx context.Context, addrs []netip.Addr, wait time.Duration) (map[netip.Addr]net.HardwareAddr, error) {
	if h.Link == "" {
		return nil, fmt.Errorf("netnstest: %s has no link to the node to resolve on", h.Name)
	}
	out := map[netip.Addr]net.HardwareAddr{}
	err := h.Do(func() error {
		l, err := netlink.LinkByName(h.Link)
		if err != nil {
			return fmt.Errorf("find link %s: %w", h.Link, err)
		}
		idx := l.Attrs().Index
		var routes []*netlink.Route
		defer func() {
			for _, r := range routes {
				netlink.RouteDel(r)
			}
			for _, a := range addrs {
				netlink.NeighDel(&netlink.Neigh{LinkIndex: idx, IP: a.AsSlice()})
			}
		}()
		for _, a := range addrs {
			r := &netlink.Route{LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("route %s dev %s: %w", a, h.Link, err)
			}
			routes = append(routes, r)
			if err := poke(a); err != nil {
				return err
			}
		}
		deadline := time.Now().Add(wait)
		for len(out) < len(addrs) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(neighPoll)
			list, err := netlink.NeighList(idx, netlink.FAMILY_ALL)
			if err != nil {
				return fmt.Errorf("neighbours of %s: %w", h.Link, err)
			}
			for _, n := range list {
				a, ok := netip.AddrFromSlice(n.IP)
				if ok && len(n.HardwareAddr) > 0 && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
					out[a.Unmap()] = n.HardwareAddr
				}
			}
		}
		return ctx.Err()
	})
	return out, err
}

// poke sends one datagram to a's discard port, which makes the kernel
// resolve a's link-layer address.
func poke(a netip.Addr) error {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9)))
	if err != nil {
		return fmt.Errorf("datagram to %s: %w", a, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("who")); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("datagram to %s: %w", a, err)
	}
	return nil
}
