//go:build privileged

package userspace

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// linkAddrs returns the addresses on a host's loopback with the proxy's
// mark, and the others, read back with a netlink dump of its own.
func linkAddrs(t *testing.T, h *netnstest.Host, proto uint8) (marked, other []netip.Addr) {
	t.Helper()
	rt, err := rtnl.Open(h.NS)
	require.NoError(t, err)
	defer rt.Close()
	list, err := rt.Addrs(t.Context(), 1) // lo
	require.NoError(t, err)
	for _, x := range list {
		if a := x.Prefix.Addr(); x.Proto == proto {
			marked = append(marked, a)
		} else if !a.IsLoopback() {
			other = append(other, a)
		}
	}
	slices.SortFunc(marked, netip.Addr.Compare)
	slices.SortFunc(other, netip.Addr.Compare)
	return marked, other
}

// holdService is a service with both families' cluster IPs, an external
// IP and a node port on the node's address.
func holdService(n int, eps ...servicelb.Endpoint) servicelb.Service {
	s := service(n, eps...)
	s.ClusterIPs = append(s.ClusterIPs, netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x96, 15: byte(n)}))
	s.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{172, 16, 0, byte(n)})}
	return s
}

// TestHoldAddresses: the proxy holds the addresses its listeners need on
// the loopback, marked as its own, and never the node's; it releases
// them when the services go; a restarted proxy adopts them (and removes
// those it no longer needs); Cleanup removes every marked address and
// nothing else.
func TestHoldAddresses(t *testing.T) {
	h := netnstest.NewHost(t, "node")
	nodeIP := netip.MustParsePrefix("192.0.2.1/32")
	h.AddAddress(t, nodeIP)
	foreign := netip.MustParsePrefix("10.96.0.2/32") // someone else's, on lo
	h.Exec(t, "ip", "address", "add", foreign.String(), "dev", "lo")
	node := servicelb.NodeConfig{NodeIPs: []netip.Addr{nodeIP.Addr()}}
	o := Options{NetNS: h.NS, HoldAddresses: true}
	p, err := New(o)
	require.NoError(t, err)
	s1 := holdService(1, ep(0))
	s1.ExternalIPs = append(s1.ExternalIPs, nodeIP.Addr()) // a node address: not held
	mustSync(t, p, mustState(t, node, s1, holdService(2, ep(0))))
	marked, other := linkAddrs(t, h, DefaultAddressProtocol)
	assert.Equal(t, addrs("10.96.0.1", "172.16.0.1", "172.16.0.2", "fd00:96::1", "fd00:96::2"), marked)
	assert.Equal(t, addrs("10.96.0.2", "192.0.2.1"), other, "a foreign address")
	listening := h.Exec(t, "ss", "-lntu") + h.Exec(t, "ss", "-lntu", "-6")
	for _, want := range []string{"10.96.0.1:80", "10.96.0.2:80", "172.16.0.1:80", "192.0.2.1:80", "10.96.0.1:53"} {
		assert.Contains(t, listening, want)
	}
	// No IPv6 endpoint: the IPv6 ports reject, with their address held
	// and no listener.
	assert.NotContains(t, listening, "fd00:96::1")

	mustSync(t, p, mustState(t, node, holdService(2, ep(0))))
	marked, _ = linkAddrs(t, h, DefaultAddressProtocol)
	assert.Equal(t, addrs("172.16.0.2", "fd00:96::2"), marked, "released")

	// A restart: the new proxy adopts what it needs, and removes what
	// the old one held that it does not.
	require.NoError(t, p.Close())
	p, err = New(o)
	require.NoError(t, err)
	defer p.Close()
	mustSync(t, p, mustState(t, node, holdService(3, ep(0))))
	marked, other = linkAddrs(t, h, DefaultAddressProtocol)
	assert.Equal(t, addrs("10.96.0.3", "172.16.0.3", "fd00:96::3"), marked)
	assert.Equal(t, addrs("10.96.0.2", "192.0.2.1"), other)

	require.NoError(t, p.Cleanup(context.Background()))
	marked, other = linkAddrs(t, h, DefaultAddressProtocol)
	assert.Empty(t, marked)
	assert.Equal(t, addrs("10.96.0.2", "192.0.2.1"), other, "Cleanup removed a foreign address")
}

// TestHeldAddressRepaired: an address someone removes is put back by the
// next sync that looks at the kernel in depth (a sync without changes);
// the listener on it serves again.
func TestHeldAddressRepaired(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", tcpTarget)
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}}}
	st := mustState(t, servicelb.NodeConfig{}, s)
	mustSync(t, p, st)
	vip := netip.MustParseAddrPort("10.96.0.10:80")
	_, err = tp.Client.Ask(context.Background(), "tcp", vip)
	require.NoError(t, err)
	tp.Node.Exec(t, "ip", "address", "del", "10.96.0.10/32", "dev", "lo")
	_, err = tp.Client.Ask(context.Background(), "tcp", vip, netnstest.Timeout(300*time.Millisecond))
	require.Error(t, err)
	mustSync(t, p, st)
	r, err := tp.Client.Ask(context.Background(), "tcp", vip)
	require.NoError(t, err)
	assert.Equal(t, "backend-0", r.Host)
}

// TestConnectTimeout: an endpoint that never answers is given up after
// ConnectTimeout and another tried, so the client is served.
func TestConnectTimeout(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", tcpTarget)
	// Packets to 10.244.1.9 go to backend 0's link and nobody answers.
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true, ConnectTimeout: 200 * time.Millisecond, DialAttempts: 2})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
		Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)},
			{Addr: netip.MustParseAddr("10.244.1.9")}},
		Scheduler: servicelb.SchedulerRoundRobin}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	var errs []string
	for range 4 {
		r, err := tp.Client.Ask(context.Background(), "tcp", netip.MustParseAddrPort("10.96.0.10:80"), netnstest.Timeout(2*time.Second))
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		assert.Equal(t, "backend-0", r.Host)
	}
	assert.Empty(t, errs)
	assert.Equal(t, uint64(2), stats(t, p, servicelb.ServicePortKey{Service: "ns/web", Family: servicelb.IPv4}).DialErrors,
		"two of four connections met the silent endpoint first")
}

// TestHeldAddressListedAsNodes: a node config that lists an address the
// proxy holds among the node's own (a listing of every address of the
// namespace, the proxy's link included) leaves it held and served.
func TestHeldAddressListedAsNodes(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	tp.Backends[0].Serve(t, "tcp", tcpTarget)
	p, err := New(Options{NetNS: tp.Node.NS, HoldAddresses: true})
	require.NoError(t, err)
	defer p.Close()
	s := servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, TargetPort: tcpTarget}},
		Endpoints: []servicelb.Endpoint{{Addr: netnstest.BackendIPv4(0)}}}
	mustSync(t, p, mustState(t, servicelb.NodeConfig{}, s))
	mustSync(t, p, mustState(t, servicelb.NodeConfig{LocalIPs: addrs("10.96.0.10")}, s))
	marked, _ := linkAddrs(t, tp.Node, DefaultAddressProtocol)
	assert.Equal(t, addrs("10.96.0.10"), marked)
	r, err := tp.Client.Ask(context.Background(), "tcp", netip.MustParseAddrPort("10.96.0.10:80"))
	require.NoError(t, err)
	assert.Equal(t, "backend-0", r.Host)
}

// TestSyncErrorNamesBackendOnce: a Sync that fails says "userspace" once,
// where the sync engine starts its error; the step that failed (a link of
// the proxy's name that is not its kind) does not repeat it.
func TestSyncErrorNamesBackendOnce(t *testing.T) {
	h := netnstest.NewHost(t, "node")
	h.Exec(t, "ip", "link", "add", "kpx-taken0", "type", "veth", "peer", "name", "kpx-taken1")
	p, err := New(Options{NetNS: h.NS, HoldAddresses: true, Link: "kpx-taken0"})
	require.NoError(t, err)
	defer p.Close()
	err = servicetest.SyncErr(p.Sync(context.Background(), mustState(t, servicelb.NodeConfig{}, holdService(1, ep(0)))))
	require.ErrorIs(t, err, ErrLinkConflict)
	assert.Equal(t, 1, strings.Count(err.Error(), "userspace"), err.Error())
	assert.True(t, strings.HasPrefix(err.Error(), "userspace: sync: kpx-taken0: "), err.Error())
}
