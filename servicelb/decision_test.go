package servicelb

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestVerdicts walks kube-proxy's decision table: for each shape of
// service and node, the verdict of every origin for the cluster IP and for
// the external frontends.
func TestVerdicts(t *testing.T) {
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}
	local := ep("10.0.0.1", "n1", "rs")
	remote := ep("10.0.1.1", "n2", "rs")
	for _, tt := range []struct {
		name               string
		eps                []Endpoint
		itp, etp           TrafficPolicy
		node               NodeConfig
		internal, external string
	}{
		{
			name: "cluster policies", eps: []Endpoint{local, remote},
			node:     NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=cluster+masq pod=cluster node=cluster+masq",
			external: "outside=cluster+masq pod=cluster+masq node=cluster+masq",
		},
		{
			name: "no local-traffic detection: nothing masqueraded for the cluster IP", eps: []Endpoint{remote},
			internal: "outside=cluster pod=cluster node=cluster",
			external: "outside=cluster+masq pod=cluster+masq node=cluster+masq",
		},
		{
			name: "masquerade all", eps: []Endpoint{remote}, node: NodeConfig{ClusterCIDRs: cidrs, MasqueradeAll: true},
			internal: "outside=cluster+masq pod=cluster+masq node=cluster+masq",
			external: "outside=cluster+masq pod=cluster+masq node=cluster+masq",
		},
		{
			name: "external Local with a local endpoint: pods and the node short-circuit", eps: []Endpoint{local, remote},
			etp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=cluster+masq pod=cluster node=cluster+masq",
			external: "outside=local pod=cluster node=cluster+masq",
		},
		{
			name: "external Local without a local endpoint drops outside traffic only", eps: []Endpoint{remote},
			etp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=cluster+masq pod=cluster node=cluster+masq",
			external: "outside=drop pod=cluster node=cluster+masq",
		},
		{
			name: "external Local without detection: pods count as outside", eps: []Endpoint{remote},
			etp:      PolicyLocal,
			internal: "outside=cluster pod=cluster node=cluster",
			external: "outside=drop pod=drop node=cluster+masq",
		},
		{
			name: "internal Local without a local endpoint drops", eps: []Endpoint{remote},
			itp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=drop pod=drop node=drop",
			external: "outside=cluster+masq pod=cluster+masq node=cluster+masq",
		},
		{
			name: "both Local, only remote endpoints: dropped from outside, short-circuited for pods and the node",
			eps:  []Endpoint{remote}, itp: PolicyLocal, etp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=drop pod=drop node=drop",
			external: "outside=drop pod=cluster node=cluster+masq",
		},
		{
			name: "both Local with a local endpoint", eps: []Endpoint{local, remote},
			itp: PolicyLocal, etp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=local+masq pod=local node=local+masq",
			external: "outside=local pod=cluster node=cluster+masq",
		},
		{
			name: "no endpoint anywhere rejects everything", itp: PolicyLocal, etp: PolicyLocal, node: NodeConfig{ClusterCIDRs: cidrs},
			internal: "outside=reject pod=reject node=reject",
			external: "outside=reject pod=reject node=reject",
		},
		{
			name: "only a not-ready endpoint: rejected", eps: []Endpoint{ep("10.0.1.1", "n2", "")},
			internal: "outside=reject pod=reject node=reject",
			external: "outside=reject pod=reject node=reject",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node := tt.node
			node.NodeName = "n1"
			node.NodeIPs = []netip.Addr{a("192.0.2.1")}
			s := Service{
				Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")},
				Ports:                 []Port{{Name: "p", Protocol: TCP, Port: 80, NodePort: 30000}},
				InternalTrafficPolicy: tt.itp, ExternalTrafficPolicy: tt.etp, Endpoints: tt.eps,
			}
			sp := compile(t, node, s)
			assert.Equal(t, tt.internal, sp.Internal.String(), "internal verdicts")
			assert.Equal(t, tt.external, sp.External.String(), "external verdicts")
			assert.Equal(t, sp.Internal, sp.Verdicts(ClusterIPFrontend))
			assert.Equal(t, sp.External, sp.Verdicts(NodePortFrontend))
		})
	}
}

// TestOnlyNamedPorts: an endpoint that names its ports serves only those
// (an EndpointSlice's endpoints serve the slice's ports).
func TestOnlyNamedPorts(t *testing.T) {
	s := Service{
		Name: "ns/w", ClusterIPs: []netip.Addr{a("10.96.0.1")},
		Ports: []Port{{Name: "http", Protocol: TCP, Port: 80}, {Name: "metrics", Protocol: TCP, Port: 9090}},
		Endpoints: []Endpoint{
			{Addr: a("10.0.0.1"), Ports: map[string]uint16{"metrics": 9100}, OnlyNamedPorts: true},
			{Addr: a("10.0.0.2"), Ports: map[string]uint16{"http": 8080, "metrics": 9100}, OnlyNamedPorts: true},
		},
	}
	st, err := NewState(NodeConfig{}, s)
	require.NoError(t, err)
	http := st.Port(ServicePortKey{"ns/w", "http", IPv4})
	metrics := st.Port(ServicePortKey{"ns/w", "metrics", IPv4})
	assert.Equal(t, []Backend{{Addr: a("10.0.0.2"), Port: 8080, Weight: 1, Ready: true}}, http.Cluster)
	assert.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:8080")}, http.ServingEndpoints())
	assert.Equal(t, []string{"10.0.0.1", "10.0.0.2"}, addrs(metrics.Cluster))
}

// TestSourceRanges: kube-proxy's firewall: the ranges of the port's family;
// the node only through the ranges, and the load-balancer IPs as sources
// only when a node address is in them; ranges of the other family, or an
// all-addresses range, leave the port open.
func TestSourceRanges(t *testing.T) {
	pfx := netip.MustParsePrefix
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1"), a("2001:db8::1")}}
	svc := func(ranges ...string) Service {
		s := Service{
			Name: "ns/lb", ClusterIPs: []netip.Addr{a("10.96.0.1"), a("fd00::1")},
			LoadBalancerIPs: []netip.Addr{a("203.0.113.10"), a("2001:db8:9::10")},
			Ports:           []Port{{Protocol: TCP, Port: 80}}, Endpoints: []Endpoint{ep("10.0.0.1", "", "rs")},
		}
		for _, r := range ranges {
			s.SourceRanges = append(s.SourceRanges, pfx(r))
		}
		return s
	}
	for _, tt := range []struct {
		name   string
		ranges []string
		v4, v6 []netip.Prefix
	}{
		{"none", nil, nil, nil},
		{"node outside the ranges", []string{"198.51.100.0/24"}, []netip.Prefix{pfx("198.51.100.0/24")}, nil},
		{"node inside: the VIP too", []string{"192.0.2.0/24"}, []netip.Prefix{pfx("192.0.2.0/24"), pfx("203.0.113.10/32")}, nil},
		{"every address", []string{"0.0.0.0/0", "2001:db8::/32"}, nil, []netip.Prefix{pfx("2001:db8::/32")}},
		{"one range inside another, the VIP inside a range", []string{"192.0.2.0/24", "192.0.2.128/25", "203.0.113.0/24"},
			[]netip.Prefix{pfx("192.0.2.0/24"), pfx("203.0.113.0/24")}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, err := NewState(node, svc(tt.ranges...))
			require.NoError(t, err)
			assert.Equal(t, tt.v4, st.Port(ServicePortKey{"ns/lb", "", IPv4}).SourceRanges, "IPv4")
			assert.Equal(t, tt.v6, st.Port(ServicePortKey{"ns/lb", "", IPv6}).SourceRanges, "IPv6")
		})
	}
}

// TestDroppedServiceCIDRs: the service CIDRs of a family, none inside
// another, ordered, as every backend drops the flows to their addresses
// that no frontend takes; the cluster CIDRs that tell pods resolve alike.
func TestDroppedServiceCIDRs(t *testing.T) {
	pfx := netip.MustParsePrefix
	n := NodeConfig{
		ServiceCIDRs: []netip.Prefix{pfx("fd00:96::/112"), pfx("10.96.128.0/17"), pfx("10.96.0.0/16"), pfx("10.0.0.0/24"), pfx("fd00:96::/120")},
		ClusterCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("10.244.0.0/16"), pfx("10.1.0.0/16")},
	}
	require.NoError(t, ValidateNode(&n))
	assert.Equal(t, []netip.Prefix{pfx("10.0.0.0/24"), pfx("10.96.0.0/16")}, n.DroppedServiceCIDRs(IPv4))
	assert.Equal(t, []netip.Prefix{pfx("fd00:96::/112")}, n.DroppedServiceCIDRs(IPv6))
	assert.Nil(t, (&NodeConfig{}).DroppedServiceCIDRs(IPv4))
	assert.Equal(t, []netip.Prefix{pfx("10.1.0.0/16"), pfx("10.244.0.0/16")}, n.LocalMatch(IPv4).CIDRs)
	assert.Equal(t, pfx("fd00:96::/112"), n.ServiceCIDRs[0], "the node's own list is left as it is")
}

// TestHairpinAndServing: every endpoint a verdict may forward to is a
// hairpin address; every serving endpoint counts for stale flows,
// whatever is selected.
func TestHairpinAndServing(t *testing.T) {
	s := Service{
		Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")}, Ports: []Port{{Protocol: UDP, Port: 53}},
		Endpoints: []Endpoint{
			ep("10.0.0.3", "n2", "rs"), ep("10.0.0.1", "n1", "rs"), weighted(ep("10.0.0.2", "n2", "rs"), 0),
			ep("10.0.0.4", "n2", "st"), ep("10.0.0.5", "n2", ""),
		},
	}
	sp := compile(t, NodeConfig{NodeName: "n1"}, s)
	assert.Equal(t, []netip.Addr{a("10.0.0.1"), a("10.0.0.3")}, slices.Collect(sp.HairpinAddrs()))
	assert.Equal(t, slices.Collect(sp.HairpinAddrs()), sp.Hairpin, "the deprecated list")
	assert.Equal(t, sp.ServingEndpoints(), sp.Serving, "the deprecated list")
	assert.Equal(t, []netip.AddrPort{
		netip.MustParseAddrPort("10.0.0.1:53"), netip.MustParseAddrPort("10.0.0.2:53"),
		netip.MustParseAddrPort("10.0.0.3:53"), netip.MustParseAddrPort("10.0.0.4:53"),
	}, sp.ServingEndpoints())
}

// TestFrontends lists a port's frontends with their kinds.
func TestFrontends(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1")}}
	s := Service{Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")}, ExternalIPs: []netip.Addr{a("198.51.100.7")},
		LoadBalancerIPs: []netip.Addr{a("203.0.113.9")}, Ports: []Port{{Protocol: TCP, Port: 80, NodePort: 30080}}}
	sp := compile(t, node, s)
	var got []string
	for _, f := range sp.Frontends() {
		got = append(got, f.String())
	}
	want := []string{"cluster IP 10.96.0.1:80", "external IP 198.51.100.7:80", "load-balancer IP 203.0.113.9:80", "node port 192.0.2.1:30080"}
	assert.Equal(t, want, got)
	// A walk of AllFrontends stops where its loop does.
	for n := range len(want) + 1 {
		got = got[:0]
		for f := range sp.AllFrontends() {
			if len(got) == n {
				break
			}
			got = append(got, f.String())
		}
		assert.Equal(t, want[:min(n, len(want))], got, "the first %d", n)
	}
}

// TestHairpinReadsTheSetsInUse: the hairpin addresses are those of the
// sets a verdict forwards to, merged in order, each once however many
// ports and sets it has.
func TestHairpinReadsTheSetsInUse(t *testing.T) {
	b := func(addr string, port uint16) Backend {
		return Backend{Addr: a(addr), Port: port, Weight: 1, Ready: true}
	}
	sp := ServicePort{ClusterIP: a("10.96.0.1"),
		Cluster: []Backend{b("10.0.0.1", 80), b("10.0.0.1", 81), b("10.0.0.4", 80)},
		Local:   []Backend{b("10.0.0.1", 80), b("10.0.0.2", 80), b("10.0.0.5", 80)}}
	sp.Internal[FromPod].Action = ToCluster
	assert.Equal(t, []netip.Addr{a("10.0.0.1"), a("10.0.0.4")}, slices.Collect(sp.HairpinAddrs()), "Cluster alone in use")
	assert.False(t, sp.IsHairpin(a("10.0.0.2")), "an address of Local, which no verdict uses")
	sp.Internal[FromNode].Action = ToLocal
	want := []netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("10.0.0.4"), a("10.0.0.5")}
	assert.Equal(t, want, slices.Collect(sp.HairpinAddrs()), "both in use")
	for _, x := range want {
		assert.True(t, sp.IsHairpin(x), "%s", x)
	}
	assert.False(t, sp.IsHairpin(a("10.0.0.3")))
	var first []netip.Addr
	for x := range sp.HairpinAddrs() {
		if len(first) == 2 {
			break
		}
		first = append(first, x)
	}
	assert.Equal(t, want[:2], first, "a walk stops where its loop does")
	sp.Internal[FromPod].Action, sp.Internal[FromNode].Action = Drop, Drop
	assert.Empty(t, slices.Collect(sp.HairpinAddrs()), "no set in use")
}
