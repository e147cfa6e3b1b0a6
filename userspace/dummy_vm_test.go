//go:build vm

package userspace

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestDummyLink: with Link naming a dummy link, the proxy creates it,
// holds the service addresses there and serves them; Cleanup deletes the
// link; a link of that name of another kind is refused.
func TestDummyLink(t *testing.T) {
	netnstest.Require(t, "dummy", "veth")
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", tcpTarget)
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true, Link: "kproxy-us0"})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10", "fd00:96::10"),
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}, {Addr: netnstest.BackendIPv6(0)}}}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	link := tp.Node.Exec(t, "ip", "-d", "address", "show", "dev", "kproxy-us0")
	assert.Contains(t, link, "dummy")
	assert.Contains(t, link, "10.96.0.10/32")
	assert.Contains(t, link, "fd00:96::10/128")
	for _, vip := range []string{"10.96.0.10:80", "[fd00:96::10]:80"} {
		r, err := tp.Client.Ask(context.Background(), "tcp", netip.MustParseAddrPort(vip))
		require.NoError(t, err, vip)
		assert.Equal(t, "backend-0", r.Host)
	}
	require.NoError(t, p.Cleanup(context.Background()))
	assert.NotContains(t, tp.Node.Exec(t, "ip", "link", "show"), "kproxy-us0")

	tp.Node.Exec(t, "ip", "link", "add", "kproxy-us1", "type", "veth", "peer", "name", "kproxy-us2")
	q, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true, Link: "kproxy-us1"})
	require.NoError(t, err)
	defer q.Close()
	err = servicetest.SyncErr(q.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, s)))
	require.ErrorIs(t, err, ErrLinkConflict)
	assert.True(t, strings.Contains(err.Error(), "kproxy-us1"), "%v", err)
}

// TestPreexistingLinkKept: a dummy link of Link's name that someone else
// made serves the proxy as well; Cleanup removes the addresses the proxy
// put there and leaves the link, with its own address.
func TestPreexistingLinkKept(t *testing.T) {
	netnstest.Require(t, "dummy")
	h := netnstest.NewHost(t, "node")
	h.Exec(t, "ip", "link", "add", "kproxy-us0", "type", "dummy")
	h.Exec(t, "ip", "address", "add", "192.0.2.9/32", "dev", "kproxy-us0")
	p, err := New(Options{NetNS: h.NS, HoldAddresses: true, Link: "kproxy-us0"})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2")}}}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	link := h.Exec(t, "ip", "address", "show", "dev", "kproxy-us0")
	assert.Contains(t, link, "10.96.0.10/32")
	assert.Contains(t, link, "UP", "set up")
	require.NoError(t, p.Cleanup(context.Background()))
	link = h.Exec(t, "ip", "address", "show", "dev", "kproxy-us0")
	assert.NotContains(t, link, "10.96.0.10")
	assert.Contains(t, link, "192.0.2.9/32")
}
