//go:build privileged || vm

package nftables_test

import (
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// icmpUnreachables returns how many ICMP (or ICMPv6) destination
// unreachable messages h has received.
func icmpUnreachables(t *testing.T, h *netnstest.Host, v6 bool) int {
	t.Helper()
	if v6 {
		for _, line := range strings.Split(h.Exec(t, "cat", "/proc/net/snmp6"), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "Icmp6InDestUnreachs" {
				n, err := strconv.Atoi(f[1])
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no Icmp6InDestUnreachs in /proc/net/snmp6")
	}
	var names []string
	for _, line := range strings.Split(h.Exec(t, "cat", "/proc/net/snmp"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Icmp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "InDestUnreachs" {
				n, err := strconv.Atoi(f[i])
				require.NoError(t, err)
				return n
			}
		}
	}
	t.Fatal("no Icmp InDestUnreachs in /proc/net/snmp")
	return 0
}

// requireICMPRefusal asks dst from h and requires a refused connection
// (ECONNREFUSED) that came as an ICMP port unreachable: h's count of
// unreachables grows, which a TCP reset would not make it do.
func requireICMPRefusal(t *testing.T, h *netnstest.Host, proto string, dst netip.AddrPort) {
	t.Helper()
	v6 := dst.Addr().Is6()
	before := icmpUnreachables(t, h, v6)
	_, err := ask(t, h, proto, dst)
	require.ErrorIs(t, err, netnstest.ErrRefused, "%s %s", proto, dst)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "%s %s: a port unreachable, not a host or network unreachable", proto, dst)
	require.Greater(t, icmpUnreachables(t, h, v6), before, "%s %s refused without an ICMP unreachable (a TCP reset?)", proto, dst)
}

// rejectKinds lists the kinds of the reject statements of a table, as
// `nft -j` reads them from the kernel.
func rejectKinds(t *testing.T, h *netnstest.Host) []string {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	require.NoError(t, json.Unmarshal([]byte(h.Exec(t, "nft", "-j", "list", "table", "inet", nftables.DefaultTable)), &doc))
	var kinds []string
	for _, obj := range doc.Nftables {
		raw, ok := obj["rule"]
		if !ok {
			continue
		}
		var r struct {
			Expr []map[string]json.RawMessage `json:"expr"`
		}
		require.NoError(t, json.Unmarshal(raw, &r))
		for _, e := range r.Expr {
			if rej, ok := e["reject"]; ok {
				kinds = append(kinds, string(rej))
			}
		}
	}
	return kinds
}

// routeServiceCIDRs gives the node routes to the service CIDRs through
// the client link, as a node's default route would: the node's own flows
// to a cluster IP need a route before the proxier translates them.
func routeServiceCIDRs(t *testing.T, l *lab) {
	l.tp.Node.Exec(t, "ip", "route", "add", "10.96.0.0/16", "dev", netnstest.ClientLink)
	l.tp.Node.Exec(t, "ip", "-6", "route", "add", "fd00:96::/112", "dev", netnstest.ClientLink)
}

// TestRejectIsICMP: a port without endpoints refuses new flows with an
// ICMP (ICMPv6) port unreachable, over TCP as well as UDP: the client
// receives the ICMP error, and the kernel holds no TCP reset.
func TestRejectIsICMP(t *testing.T) {
	l := newLab(t, 1, nftables.Options{})
	routeServiceCIDRs(t, l)
	st := l.sync(t, webService())
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(clusterIP4, 80), netip.AddrPortFrom(clusterIP6, 80),
		netip.AddrPortFrom(netnstest.NodeIPv4(), 30080), netip.AddrPortFrom(netnstest.NodeIPv6(), 30080),
	} {
		for _, proto := range []string{"tcp", "udp"} {
			requireICMPRefusal(t, l.tp.Client, proto, dst)
		}
	}
	requireICMPRefusal(t, l.tp.Node, "tcp", netip.AddrPortFrom(clusterIP4, 80))
	kinds := rejectKinds(t, l.tp.Node)
	require.NotEmpty(t, kinds)
	for _, k := range kinds {
		assert.NotContains(t, k, "tcp", "reject statement %s in the kernel", k)
	}
	text, err := l.p.Render(st)
	require.NoError(t, err)
	assert.NotContains(t, text, "tcp reset")
}

// TestClusterIPChecks: a cluster IP refuses (ICMP port unreachable) the
// ports no service has, with or without service CIDRs; an address of the
// service CIDRs that is no cluster IP drops everything. A host behind the
// node holds these addresses, so that what the proxier let through would
// get that host's TCP reset instead.
func TestClusterIPChecks(t *testing.T) {
	l := newLab(t, 1, nftables.Options{})
	unallocated4, unallocated6 := netip.MustParseAddr("10.96.0.99"), netip.MustParseAddr("fd00:96::99")
	for _, a := range []netip.Addr{clusterIP4, clusterIP6, unallocated4, unallocated6} {
		l.tp.Backends[0].AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
	}
	svc := webService(endpoints("", 0)...)
	l.sync(t, svc)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 81), netip.AddrPortFrom(clusterIP6, 81)} {
		requireICMPRefusal(t, l.tp.Client, "tcp", dst)
	}
	// A protocol the port does not have is an undefined port too.
	svc.Ports = svc.Ports[:1]
	l.sync(t, svc)
	requireICMPRefusal(t, l.tp.Client, "udp", netip.AddrPortFrom(clusterIP4, 80))
	_, err := ask(t, l.tp.Client, "tcp", netip.AddrPortFrom(unallocated4, 80))
	require.ErrorIs(t, err, netnstest.ErrRefused, "without service CIDRs the host behind answers")

	l.node.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	l.sync(t, svc)
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(clusterIP4, 81), netip.AddrPortFrom(clusterIP6, 81)} {
		requireICMPRefusal(t, l.tp.Client, "tcp", dst)
	}
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(unallocated4, 80), netip.AddrPortFrom(unallocated6, 80)} {
		_, err := ask(t, l.tp.Client, "tcp", dst)
		assert.ErrorIs(t, err, netnstest.ErrTimeout, "unallocated %s", dst)
	}
	mustAsk(t, l.tp.Client, "tcp", netip.AddrPortFrom(clusterIP4, 80))
	// A cluster IP whose service goes is unallocated again.
	l.sync(t)
	_, err = ask(t, l.tp.Client, "tcp", netip.AddrPortFrom(clusterIP4, 81))
	assert.ErrorIs(t, err, netnstest.ErrTimeout, "cluster IP of a deleted service")
}

// TestLocalPoliciesFromPodAndNode: under the external Local policy with
// no local endpoint, clients outside are dropped at the node port, while
// a pod reaches the cluster's endpoints with its own address and the node
// masqueraded, under either internal policy; under the internal Local
// policy the cluster IP drops every origin.
func TestLocalPoliciesFromPodAndNode(t *testing.T) {
	l := newLab(t, 3, nftables.Options{})
	routeServiceCIDRs(t, l)
	for _, internal := range []servicelb.TrafficPolicy{servicelb.PolicyCluster, servicelb.PolicyLocal} {
		t.Run(string(internal), func(t *testing.T) {
			svc := webService(endpoints("other", 1)...)
			svc.ExternalTrafficPolicy, svc.InternalTrafficPolicy = servicelb.PolicyLocal, internal
			l.sync(t, svc)
			for _, tc := range []struct {
				np, cluster       netip.AddrPort
				pod, node, remote netip.Addr
			}{
				{netip.AddrPortFrom(netnstest.NodeIPv4(), 30080), netip.AddrPortFrom(clusterIP4, 80),
					netnstest.BackendIPv4(2), l.tp.Backends[1].Gateway4, netnstest.BackendIPv4(1)},
				{netip.AddrPortFrom(netnstest.NodeIPv6(), 30080), netip.AddrPortFrom(clusterIP6, 80),
					netnstest.BackendIPv6(2), l.tp.Backends[1].Gateway6, netnstest.BackendIPv6(1)},
			} {
				_, err := ask(t, l.tp.Client, "tcp", tc.np)
				assert.ErrorIs(t, err, netnstest.ErrTimeout, "client to %s", tc.np)
				for _, proto := range []string{"tcp", "udp"} {
					r := mustAsk(t, l.tp.Backends[2], proto, tc.np)
					assert.Equal(t, netnstest.Reply{Host: "backend-1", Client: netip.AddrPortFrom(tc.pod, r.Client.Port()), Port: backendPort}, r, "pod %s to %s", proto, tc.np)
					r = mustAsk(t, l.tp.Node, proto, tc.np)
					assert.Equal(t, netnstest.Reply{Host: "backend-1", Client: netip.AddrPortFrom(tc.node, r.Client.Port()), Port: backendPort}, r, "node %s to %s", proto, tc.np)
				}
				for _, h := range []*netnstest.Host{l.tp.Client, l.tp.Backends[2], l.tp.Node} {
					r, err := ask(t, h, "tcp", tc.cluster)
					if internal == servicelb.PolicyLocal {
						assert.ErrorIs(t, err, netnstest.ErrTimeout, "%s to %s", h.Name, tc.cluster)
					} else if assert.NoError(t, err, "%s to %s", h.Name, tc.cluster) {
						assert.Equal(t, "backend-1", r.Host)
					}
				}
			}
		})
	}
}

// TestSourceRangesNodeToOwnVIP: the node reaches a load-balancer IP it
// holds itself when one of its addresses is in the source ranges, and is
// dropped when none is.
func TestSourceRangesNodeToOwnVIP(t *testing.T) {
	l := newLab(t, 1, nftables.Options{})
	l.tp.Node.AddAddress(t, netip.PrefixFrom(lbIP4, 32))
	svc := webService(endpoints("", 0)...)
	svc.LoadBalancerIPs = []netip.Addr{lbIP4}
	vip := netip.AddrPortFrom(lbIP4, 80)
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")} // the node's and the client's
	l.sync(t, svc)
	assert.Equal(t, "backend-0", mustAsk(t, l.tp.Node, "tcp", vip).Host, "node in the ranges")
	assert.Equal(t, "backend-0", mustAsk(t, l.tp.Client, "tcp", vip).Host, "client in the ranges")

	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.2/32")} // the client's only
	l.sync(t, svc)
	_, err := ask(t, l.tp.Node, "tcp", vip)
	assert.ErrorIs(t, err, netnstest.ErrTimeout, "node outside the ranges")
	assert.Equal(t, "backend-0", mustAsk(t, l.tp.Client, "tcp", vip).Host, "client in the ranges")
}

// TestSourceRangesOfOneFamily: ranges of one family close the
// load-balancer IPs of that family only.
func TestSourceRangesOfOneFamily(t *testing.T) {
	l := newLab(t, 1, nftables.Options{})
	lb6 := netip.MustParseAddr("fd00:113::10")
	svc := webService(endpoints("", 0)...)
	svc.LoadBalancerIPs = []netip.Addr{lbIP4, lb6}
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	l.sync(t, svc)
	_, err := ask(t, l.tp.Client, "tcp", netip.AddrPortFrom(lbIP4, 80))
	assert.ErrorIs(t, err, netnstest.ErrTimeout, "IPv4 client outside the IPv4 ranges")
	for _, proto := range []string{"tcp", "udp"} {
		r, err := ask(t, l.tp.Client, proto, netip.AddrPortFrom(lb6, 80))
		if assert.NoError(t, err, "IPv6 %s, no IPv6 ranges", proto) {
			assert.Equal(t, "backend-0", r.Host)
		}
	}
}

// TestHairpinRemoteEndpoint: an endpoint that another node runs, but
// whose traffic this node routes, reaches itself through its service,
// masqueraded so that its reply comes back through the node.
func TestHairpinRemoteEndpoint(t *testing.T) {
	l := newLab(t, 2, nftables.Options{})
	l.sync(t, webService(endpoints("other", 0)...))
	b := l.tp.Backends[0]
	for _, tc := range []struct{ dst, want netip.Addr }{{clusterIP4, b.Gateway4}, {clusterIP6, b.Gateway6}} {
		for _, proto := range []string{"tcp", "udp"} {
			r, err := ask(t, b, proto, netip.AddrPortFrom(tc.dst, 80))
			if assert.NoError(t, err, "hairpin %s %s", proto, tc.dst) {
				assert.Equal(t, netnstest.Reply{Host: "backend-0", Client: netip.AddrPortFrom(tc.want, r.Client.Port()), Port: backendPort}, r)
			}
		}
	}
	// Another pod keeps its address.
	r := mustAsk(t, l.tp.Backends[1], "tcp", netip.AddrPortFrom(clusterIP4, 80))
	assert.Equal(t, netnstest.BackendIPv4(1), r.Client.Addr())
}
