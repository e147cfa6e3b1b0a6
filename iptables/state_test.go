//go:build linux

package iptables

import (
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func ep(addr, node string) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: netip.MustParseAddr(addr), NodeName: node}
}

// richNode is a dual-stack node with cluster and service CIDRs.
func richNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     "node-a",
		NodeIPs:      addrs("198.51.100.1", "fd00:c::1"),
		ClusterCIDRs: prefixes("10.244.0.0/16", "fd00:244::/48"),
		ServiceCIDRs: prefixes("10.96.0.0/16", "fd00:96::/112"),
	}
}

// richServices covers every service shape: cluster IPs of both families,
// node ports, load-balancer IPs with source ranges and the Local policy,
// external IPs, TCP, UDP and SCTP, weights, affinity, no endpoints, and
// internal Local without local endpoints.
func richServices() []servicelb.Service {
	weighted := ep("10.244.3.2", "node-c")
	weighted.Weight = servicelb.Weight(3)
	terminating := ep("10.244.2.9", "node-b")
	terminating.Ready, terminating.Serving, terminating.Terminating = new(false), new(true), true
	return []servicelb.Service{
		{
			Name:       "default/web",
			ClusterIPs: addrs("10.96.0.10", "fd00:96::10"),
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080, NodePort: 30080}},
			Endpoints: []servicelb.Endpoint{ep("10.244.1.2", "node-a"), ep("10.244.2.2", "node-b"),
				ep("fd00:244:1::2", "node-a"), terminating},
		},
		{
			Name:       "kube-system/dns",
			ClusterIPs: addrs("10.96.0.53"),
			Ports: []servicelb.Port{{Name: "dns", Protocol: servicelb.UDP, Port: 53},
				{Name: "dns-tcp", Protocol: servicelb.TCP, Port: 53}},
			Affinity:  servicelb.SessionAffinity{ClientIP: true, Timeout: 3 * time.Hour},
			Endpoints: []servicelb.Endpoint{ep("10.244.1.3", "node-a"), ep("10.244.2.3", "node-b")},
		},
		{
			Name:                  "lb/ingress",
			ClusterIPs:            addrs("10.96.1.1"),
			LoadBalancerIPs:       addrs("203.0.113.10"),
			SourceRanges:          prefixes("192.0.2.0/24"),
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			HealthCheckNodePort:   30500,
			Ports:                 []servicelb.Port{{Name: "https", Protocol: servicelb.TCP, Port: 443, NodePort: 30443}},
			Endpoints:             []servicelb.Endpoint{ep("10.244.1.4", "node-a"), ep("10.244.2.4", "node-b")},
		},
		{
			Name:        "ext/diameter",
			ClusterIPs:  addrs("10.96.2.2"),
			ExternalIPs: addrs("192.0.2.100"),
			Ports:       []servicelb.Port{{Protocol: servicelb.SCTP, Port: 3868}},
			Endpoints:   []servicelb.Endpoint{ep("10.244.1.5", "node-a"), weighted},
		},
		{
			Name:        "empty/none",
			ClusterIPs:  addrs("10.96.3.3"),
			ExternalIPs: addrs("192.0.2.101"),
			Ports:       []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30099}},
		},
		{
			Name:                  "local/itp",
			ClusterIPs:            addrs("10.96.4.4", "fd00:96::44"),
			InternalTrafficPolicy: servicelb.PolicyLocal,
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			Ports:                 []servicelb.Port{{Name: "p", Protocol: servicelb.TCP, Port: 8000, NodePort: 30800}},
			Endpoints:             []servicelb.Endpoint{ep("10.244.2.6", "node-b"), ep("fd00:244:2::6", "node-b")},
		},
	}
}

// detectStates are the rich services on the rich node under each other
// local-traffic detection, by name: two node CIDRs of IPv4 and none of
// IPv6 (so OFFCLUSTER-MASQ for IPv4, no pods for IPv6), a bridge, an
// interface name prefix.
func detectStates(t testing.TB) map[string]*servicelb.State {
	t.Helper()
	out := map[string]*servicelb.State{}
	for name, d := range map[string]servicelb.DetectLocal{
		"detect-node-cidr": {Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: prefixes("10.244.1.0/24", "10.244.9.0/24")},
		"detect-bridge":    {Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"},
		"detect-prefix":    {Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
	} {
		n := richNode()
		n.DetectLocal = d
		st, err := servicelb.NewState(n, richServices()...)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = st
	}
	return out
}

func richState(t testing.TB) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(richNode(), richServices()...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// The chains of service ports are not held in the content of a state:
// they are planned port by port as a sync asks for them (Parts), each
// group the chains of one port, the same on every pass, so that a cold
// sync of many ports never holds all their rules beside their encoding.
func TestContentMakesPortChainsOnDemand(t *testing.T) {
	px := newOffline(t, Options{Families: []servicelb.Family{servicelb.IPv4}})
	st := bigState(t, 3)
	want, err := px.content(st)
	require.NoError(t, err)
	nat, _ := familyTables(servicelb.IPv4)
	for name := range want[nat].Chains {
		require.False(t, strings.Contains(name, "-SVC-") || strings.Contains(name, "-SEP-"), "port chain %s held in Chains", name)
	}
	var names []string
	groups := 0
	for owner, group := range want[nat].Parts {
		require.IsType(t, servicelb.ServicePortKey{}, owner, "a group's owner")
		groups++
		for _, c := range group {
			require.NotContains(t, names, c.Name, "chain made twice")
			names = append(names, c.Name)
		}
	}
	require.Equal(t, 3, groups, "one group a port")
	require.Len(t, names, 3*11, "an SVC and ten SEP chains a port")
	node := st.Node()
	pl := newPlanner(px.n, servicelb.IPv4, &node, &px.opts)
	ports := map[string][]xtables.Rule{}
	for _, sp := range st.Ports() {
		for _, c := range pl.port(sp).chains {
			ports[c.Name] = c.Rules
		}
	}
	whole := want[nat].Whole()
	for _, name := range names {
		require.Equal(t, ports[name], whole[name], "chain %s", name)
	}
	require.Equal(t, whole, want[nat].Whole(), "a second pass makes other chains")
}

// Planning a port's chains makes few objects: a chain name is one string,
// a rule's slices are sized once. (A sync plans every port; what it
// leaves behind is garbage the collector lets grow beside the batch.)
func TestPortChainsAllocateLittle(t *testing.T) {
	px := newOffline(t, Options{Families: []servicelb.Family{servicelb.IPv4}})
	st := bigState(t, 1)
	node := st.Node()
	pl := newPlanner(px.n, servicelb.IPv4, &node, &px.opts)
	sp := st.Ports()[0]
	allocs := testing.AllocsPerRun(20, func() { _ = pl.chains(pl.plan(sp)) })
	t.Logf("%v allocations for a port of %d endpoints", allocs, len(sp.Cluster))
	require.LessOrEqual(t, allocs, 160.0, "allocations to plan a port of 10 endpoints (31 rules)")
}

// A pass over the port chains of a state reuses one port's room for the
// next: what it leaves behind is the names, comments and the matches'
// values, not the rules.
func TestPortChainsReuseRoom(t *testing.T) {
	px := newOffline(t, Options{Families: []servicelb.Family{servicelb.IPv4}})
	const n = 50
	want, err := px.content(bigState(t, n))
	require.NoError(t, err)
	nat, _ := familyTables(servicelb.IPv4)
	var bytes runtime.MemStats
	pass := func() {
		for range want[nat].Parts {
		}
	}
	pass()
	runtime.ReadMemStats(&bytes)
	before := bytes.TotalAlloc
	pass()
	runtime.ReadMemStats(&bytes)
	perPort := (bytes.TotalAlloc - before) / n
	t.Logf("%d bytes a port of 10 endpoints (31 rules)", perPort)
	require.LessOrEqual(t, perPort, uint64(4500), "bytes allocated a port of 10 endpoints")
}
