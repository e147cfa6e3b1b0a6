//go:build privileged || vm

package rtnl_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

func open(t *testing.T, h *netnstest.Host) *rtnl.Conn {
	t.Helper()
	c, err := rtnl.Open(h.NS)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func prefixes(list []rtnl.Addr, proto uint8) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range list {
		if a.Proto == proto && !a.Prefix.Addr().IsLoopback() {
			out = append(out, a.Prefix)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// TestAddresses on a throwaway namespace's loopback: marked addresses
// are added in one batch, each add and delete reports its own error (an
// address that is there already, one that is not), the listing gives
// each address its prefix length and mark, a foreign address stays
// unmarked, and new IPv6 addresses are soon routed to the node.
func TestAddresses(t *testing.T) {
	h := netnstest.NewHost(t, "rtnl")
	h.Exec(t, "ip", "address", "add", "192.0.2.0/24", "dev", "lo")
	c := open(t, h)
	lo, ok, err := c.LinkByName(t.Context(), "lo")
	require.NoError(t, err)
	require.True(t, ok)
	assert.True(t, lo.Loopback())
	assert.Empty(t, lo.Kind)
	_, ok, err = c.LinkByName(t.Context(), "nosuchlink")
	require.NoError(t, err)
	assert.False(t, ok)

	a := netip.MustParseAddr
	ops := []rtnl.AddrOp{
		{Add: true, Prefix: rtnl.Host(a("10.96.0.1"))},
		{Add: true, Prefix: rtnl.Host(a("fd00:96::1"))},
		{Add: true, Prefix: rtnl.Host(a("10.96.0.1"))}, // twice
		{Prefix: rtnl.Host(a("10.96.0.9"))},            // not there
	}
	errs, err := c.ChangeAddrs(t.Context(), lo.Index, 0x6b, ops)
	require.NoError(t, err)
	require.Len(t, errs, 4)
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[1])
	assert.ErrorIs(t, errs[2], unix.EEXIST)
	assert.True(t, rtnl.IsGone(errs[3]), "%v", errs[3])
	require.NoError(t, c.WaitLocal(t.Context(), []netip.Addr{a("10.96.0.1"), a("fd00:96::1")}, 5*time.Second))

	list, err := c.Addrs(t.Context(), lo.Index)
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.96.0.1/32"), netip.MustParsePrefix("fd00:96::1/128")}, prefixes(list, 0x6b))
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, prefixes(list, 0), "the foreign address, unmarked")

	errs, err = c.ChangeAddrs(t.Context(), lo.Index, 0, []rtnl.AddrOp{
		{Prefix: netip.MustParsePrefix("10.96.0.1/32")}, {Prefix: netip.MustParsePrefix("192.0.2.0/24")}})
	require.NoError(t, err)
	assert.Equal(t, []error{nil, nil}, errs)
	list, err = c.Addrs(t.Context(), lo.Index)
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("fd00:96::1/128")}, prefixes(list, 0x6b))
	assert.Empty(t, prefixes(list, 0))

	// The loopback is no dummy link to create: EnsureDummy finds it,
	// RemoveDummy leaves it.
	l, created, err := c.EnsureDummy(t.Context(), "lo", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, lo.Index, l.Index)
	deleted, err := c.RemoveDummy(t.Context(), "lo", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, deleted)
}

// TestRouteOIF: the route to an address of a link leaves through it, a
// local address through the loopback.
func TestRouteOIF(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	c := open(t, tp.Node)
	for _, a := range []netip.Addr{netnstest.BackendIPv4(0), netnstest.BackendIPv6(0)} {
		oif, err := c.RouteOIF(t.Context(), a)
		require.NoError(t, err)
		assert.NotZero(t, oif, a)
		assert.NotEqual(t, 1, oif, "%s routed to the loopback", a)
	}
	oif, err := c.RouteOIF(t.Context(), netnstest.NodeIPv4())
	require.NoError(t, err)
	assert.Equal(t, 1, oif, "a local address")
}

// TestLinksAndEvents: every link and every link's addresses are listed,
// each address with its link, and a subscription tells of an address
// added and deleted, and of nothing else.
func TestLinksAndEvents(t *testing.T) {
	h := netnstest.NewHost(t, "rtnl")
	h.Exec(t, "ip", "link", "add", "veth-a", "type", "veth", "peer", "name", "veth-b")
	h.Exec(t, "ip", "address", "add", "192.0.2.1/24", "dev", "veth-a")
	c := open(t, h)
	links, err := c.Links(t.Context())
	require.NoError(t, err)
	index := map[string]int{}
	for _, l := range links {
		index[l.Name] = l.Index
	}
	require.Contains(t, index, "lo")
	require.Contains(t, index, "veth-a")
	require.Contains(t, index, "veth-b")

	addrs, err := c.AllAddrs(t.Context())
	require.NoError(t, err)
	byAddr := map[netip.Prefix]int{}
	for _, a := range addrs {
		byAddr[a.Prefix] = a.Link
	}
	assert.Equal(t, index["veth-a"], byAddr[netip.MustParsePrefix("192.0.2.1/24")])
	assert.Equal(t, index["lo"], byAddr[netip.MustParsePrefix("127.0.0.1/8")])

	events, err := rtnl.WatchAddrs(h.NS)
	require.NoError(t, err)
	defer events.Close()
	quiet := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		return events.Next(ctx)
	}
	h.Exec(t, "ip", "link", "set", "veth-b", "mtu", "1400")
	assert.ErrorIs(t, quiet(), context.DeadlineExceeded, "a link's change is no address's")
	h.Exec(t, "ip", "address", "add", "198.51.100.1/32", "dev", "veth-b")
	require.NoError(t, events.Next(t.Context()), "an address added")
	h.Exec(t, "ip", "address", "del", "198.51.100.1/32", "dev", "veth-b")
	require.NoError(t, events.Next(t.Context()), "an address deleted")
}
