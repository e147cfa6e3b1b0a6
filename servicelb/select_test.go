package servicelb

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
)

// ep builds an endpoint: addr, node, and conditions given as a string of
// flags: r ready, s serving, t terminating.
func ep(addr, node, flags string) Endpoint {
	e := Endpoint{Addr: a(addr), Ready: new(false), NodeName: node}
	for _, f := range flags {
		switch f {
		case 'r':
			e.Ready = new(true)
		case 's':
			e.Serving = new(true)
		case 't':
			e.Terminating = true
		}
	}
	return e
}

func hinted(e Endpoint, zones, nodes []string) Endpoint {
	e.Hints = Hints{ForZones: zones, ForNodes: nodes}
	return e
}

func weighted(e Endpoint, w uint16) Endpoint {
	e.Weight = Weight(w)
	return e
}

// addrs returns the backends' addresses, for compact comparisons.
func addrs(bs []Backend) []string {
	out := []string{}
	for _, b := range bs {
		out = append(out, b.Addr.String())
	}
	return out
}

func compile(t *testing.T, node NodeConfig, s Service) *ServicePort {
	t.Helper()
	st, err := NewState(node, s)
	if err != nil {
		t.Fatal(err)
	}
	ports := st.Ports()
	if len(ports) != 1 {
		t.Fatalf("got %d service ports, want 1", len(ports))
	}
	return ports[0]
}

func TestSelection(t *testing.T) {
	node := NodeConfig{NodeName: "n1", Zone: "z1"}
	tests := []struct {
		name     string
		eps      []Endpoint
		itp, etp TrafficPolicy
		cluster  []string
		local    []string
		internal []string
		external []string
		// verdict is the action for outside traffic to the cluster IP
		// and to the node port: "cluster", "local", "drop", "reject".
		verdict [2]string
	}{
		{
			name:    "ready only",
			eps:     []Endpoint{ep("10.0.0.3", "n2", "rs"), ep("10.0.0.1", "n1", "rs"), ep("10.0.0.2", "n2", "")},
			cluster: []string{"10.0.0.1", "10.0.0.3"}, local: []string{"10.0.0.1"},
			internal: []string{"10.0.0.1", "10.0.0.3"}, external: []string{"10.0.0.1", "10.0.0.3"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name:    "terminating fallback when none ready",
			eps:     []Endpoint{ep("10.0.0.1", "n2", "st"), ep("10.0.0.2", "n2", "t"), ep("10.0.0.3", "n2", "s")},
			cluster: []string{"10.0.0.1"}, local: []string{},
			internal: []string{"10.0.0.1"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name:    "terminating ignored while one is ready",
			eps:     []Endpoint{ep("10.0.0.1", "n2", "st"), ep("10.0.0.2", "n2", "rs")},
			cluster: []string{"10.0.0.2"}, local: []string{},
			internal: []string{"10.0.0.2"}, external: []string{"10.0.0.2"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name:    "local fallback is per set",
			eps:     []Endpoint{ep("10.0.0.1", "n1", "st"), ep("10.0.0.2", "n2", "rs")},
			etp:     PolicyLocal,
			cluster: []string{"10.0.0.2"}, local: []string{"10.0.0.1"},
			internal: []string{"10.0.0.2"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "local"},
		},
		{
			name:    "external Local without local endpoints drops, internal still served",
			eps:     []Endpoint{ep("10.0.0.2", "n2", "rs")},
			etp:     PolicyLocal,
			cluster: []string{"10.0.0.2"}, local: []string{},
			internal: []string{"10.0.0.2"}, external: []string{}, verdict: [2]string{"cluster", "drop"},
		},
		{
			name:    "internal Local without local endpoints",
			eps:     []Endpoint{ep("10.0.0.2", "n2", "rs")},
			itp:     PolicyLocal,
			cluster: []string{"10.0.0.2"}, local: []string{},
			internal: []string{}, external: []string{"10.0.0.2"}, verdict: [2]string{"drop", "cluster"},
		},
		{
			name: "both Local without local endpoints drops, since other nodes serve",
			eps:  []Endpoint{ep("10.0.0.2", "n2", "rs")},
			itp:  PolicyLocal, etp: PolicyLocal,
			cluster: []string{"10.0.0.2"}, local: []string{},
			internal: []string{}, external: []string{}, verdict: [2]string{"drop", "drop"},
		},
		{
			name:    "no endpoints rejects",
			cluster: []string{}, local: []string{}, internal: []string{}, external: []string{}, verdict: [2]string{"reject", "reject"},
		},
		{
			name:    "weight zero drains",
			eps:     []Endpoint{weighted(ep("10.0.0.1", "n1", "rs"), 0), weighted(ep("10.0.0.2", "n2", "rs"), 3)},
			cluster: []string{"10.0.0.2"}, local: []string{},
			internal: []string{"10.0.0.2"}, external: []string{"10.0.0.2"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name:    "all drained rejects",
			eps:     []Endpoint{weighted(ep("10.0.0.1", "n1", "rs"), 0)},
			cluster: []string{}, local: []string{}, internal: []string{}, external: []string{}, verdict: [2]string{"reject", "reject"},
		},
		{
			name: "zone hints used when every ready endpoint has them",
			eps: []Endpoint{
				hinted(ep("10.0.0.1", "n2", "rs"), []string{"z1"}, nil),
				hinted(ep("10.0.0.2", "n3", "rs"), []string{"z2"}, nil),
				ep("10.0.0.3", "n3", ""), // not ready: its missing hints do not count
			},
			cluster: []string{"10.0.0.1"}, local: []string{},
			internal: []string{"10.0.0.1"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name: "hints ignored when one ready endpoint lacks them",
			eps: []Endpoint{
				hinted(ep("10.0.0.1", "n2", "rs"), []string{"z1"}, nil),
				ep("10.0.0.2", "n3", "rs"),
			},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, local: []string{},
			internal: []string{"10.0.0.1", "10.0.0.2"}, external: []string{"10.0.0.1", "10.0.0.2"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name: "hints ignored when none names this zone",
			eps: []Endpoint{
				hinted(ep("10.0.0.1", "n2", "rs"), []string{"z2"}, nil),
				hinted(ep("10.0.0.2", "n3", "rs"), []string{"z3"}, nil),
			},
			cluster: []string{"10.0.0.1", "10.0.0.2"}, local: []string{},
			internal: []string{"10.0.0.1", "10.0.0.2"}, external: []string{"10.0.0.1", "10.0.0.2"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name: "node hints win over zone hints",
			eps: []Endpoint{
				hinted(ep("10.0.0.1", "n2", "rs"), []string{"z1"}, []string{"n2"}),
				hinted(ep("10.0.0.2", "n1", "rs"), []string{"z1"}, []string{"n1"}),
			},
			cluster: []string{"10.0.0.2"}, local: []string{"10.0.0.2"},
			internal: []string{"10.0.0.2"}, external: []string{"10.0.0.2"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name: "hints do not narrow the local set",
			eps: []Endpoint{
				hinted(ep("10.0.0.1", "n1", "rs"), []string{"z2"}, nil),
				hinted(ep("10.0.0.2", "n3", "rs"), []string{"z1"}, nil),
			},
			etp:     PolicyLocal,
			cluster: []string{"10.0.0.2"}, local: []string{"10.0.0.1"},
			internal: []string{"10.0.0.2"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "local"},
		},
		{
			name:    "duplicates count once, the first stays",
			eps:     []Endpoint{ep("10.0.0.1", "n2", "rs"), ep("10.0.0.1", "n2", ""), ep("10.0.0.1", "n2", "rs")},
			cluster: []string{"10.0.0.1"}, local: []string{},
			internal: []string{"10.0.0.1"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "cluster"},
		},
		{
			name:    "a later remote duplicate does not replace the first, ready or not",
			eps:     []Endpoint{ep("10.0.0.1", "n2", ""), ep("10.0.0.1", "n3", "rs")},
			cluster: []string{}, local: []string{}, internal: []string{}, external: []string{}, verdict: [2]string{"reject", "reject"},
		},
		{
			name:    "a local duplicate wins",
			eps:     []Endpoint{ep("10.0.0.1", "n2", "rs"), ep("10.0.0.1", "n1", "rs"), ep("10.0.0.1", "n3", "rs")},
			etp:     PolicyLocal,
			cluster: []string{"10.0.0.1"}, local: []string{"10.0.0.1"},
			internal: []string{"10.0.0.1"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "local"},
		},
		{
			name:    "a local duplicate wins whatever its conditions",
			eps:     []Endpoint{ep("10.0.0.1", "n2", "rs"), ep("10.0.0.1", "n1", "")},
			cluster: []string{}, local: []string{}, internal: []string{}, external: []string{}, verdict: [2]string{"reject", "reject"},
		},
		{
			name:    "other family ignored",
			eps:     []Endpoint{ep("fd00::1", "n1", "rs"), ep("10.0.0.1", "n2", "rs")},
			cluster: []string{"10.0.0.1"}, local: []string{},
			internal: []string{"10.0.0.1"}, external: []string{"10.0.0.1"}, verdict: [2]string{"cluster", "cluster"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Service{
				Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")},
				Ports:                 []Port{{Name: "p", Protocol: TCP, Port: 80, NodePort: 30000}},
				InternalTrafficPolicy: tt.itp, ExternalTrafficPolicy: tt.etp, Endpoints: tt.eps,
			}
			sp := compile(t, node, s)
			for _, c := range []struct {
				what      string
				want, got []string
			}{
				{"cluster", tt.cluster, addrs(sp.Cluster)},
				{"local", tt.local, addrs(sp.Local)},
				{"internal", tt.internal, addrs(sp.Targets(sp.Internal[FromOutside]))},
				{"external", tt.external, addrs(sp.Targets(sp.External[FromOutside]))},
			} {
				if diff := cmp.Diff(c.want, c.got); diff != "" {
					t.Errorf("%s backends (-want +got):\n%s", c.what, diff)
				}
			}
			got := [2]string{sp.Internal[FromOutside].Action.String(), sp.External[FromOutside].Action.String()}
			if got != tt.verdict {
				t.Errorf("verdicts from outside (cluster IP, node port) = %v, want %v", got, tt.verdict)
			}
		})
	}
}

// TestTopologyModes: node and zone hints are judged apart, as kube-proxy's
// topologyModeFromHints does: the node's own endpoints (PreferSameNode)
// when every ready candidate has a node hint and one names this node; else
// its zone's (PreferSameZone) when every ready candidate has a zone hint
// and one names this zone; else every endpoint. The EndpointSlice
// controller writes node and zone hints for trafficDistribution
// PreferSameNode, zone hints for PreferSameZone (and PreferClose).
func TestTopologyModes(t *testing.T) {
	zoned := NodeConfig{NodeName: "n1", Zone: "a"}
	e1, e2, e3 := ep("10.0.0.1", "n1", "rs"), ep("10.0.0.2", "n2", "rs"), ep("10.0.0.3", "n3", "rs")
	for _, tt := range []struct {
		name string
		node *NodeConfig // default zoned
		eps  []Endpoint
		want []string
	}{
		{name: "PreferSameNode: every ready endpoint has a node hint, one for this node",
			eps:  []Endpoint{hinted(e1, []string{"a"}, []string{"n1"}), hinted(e2, []string{"a"}, []string{"n2"})},
			want: []string{"10.0.0.1"}},
		{name: "PreferSameNode without a zone on the node",
			node: &NodeConfig{NodeName: "n1"},
			eps:  []Endpoint{hinted(e1, []string{"a"}, []string{"n1"}), hinted(e2, []string{"a"}, []string{"n2"})},
			want: []string{"10.0.0.1"}},
		{name: "PreferSameNode goes by the hint, not by where the endpoint runs",
			eps:  []Endpoint{hinted(e1, nil, []string{"n3"}), hinted(e2, nil, []string{"n1"})},
			want: []string{"10.0.0.2"}},
		{name: "PreferSameNode with no endpoint for this node: zone mode",
			eps:  []Endpoint{hinted(e1, []string{"b"}, []string{"n2"}), hinted(e2, []string{"a"}, []string{"n3"})},
			want: []string{"10.0.0.2"}},
		{name: "node hints for other nodes only and a zone hint missing: no topology",
			eps:  []Endpoint{hinted(e1, []string{"a"}, []string{"n2"}), hinted(e2, nil, []string{"n3"})},
			want: []string{"10.0.0.1", "10.0.0.2"}},
		{name: "zone mode when a ready endpoint lacks a node hint",
			eps:  []Endpoint{hinted(e1, []string{"a"}, []string{"n1"}), hinted(e2, []string{"a"}, nil), hinted(e3, []string{"a"}, nil)},
			want: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}},
		{name: "zone mode picks this zone, not the node-hinted endpoint of another zone",
			eps:  []Endpoint{hinted(e1, []string{"b"}, []string{"n1"}), hinted(e2, []string{"a"}, nil)},
			want: []string{"10.0.0.2"}},
		{name: "no topology with node hints on some and zone hints on others",
			eps:  []Endpoint{hinted(e1, nil, []string{"n1"}), hinted(e2, []string{"a"}, nil)},
			want: []string{"10.0.0.1", "10.0.0.2"}},
		{name: "PreferSameZone: an endpoint hinted for several zones",
			eps:  []Endpoint{hinted(e1, []string{"b"}, nil), hinted(e2, []string{"b", "a"}, nil), hinted(e3, []string{"c"}, nil)},
			want: []string{"10.0.0.2"}},
		{name: "PreferSameZone on a node without a zone: no topology",
			node: &NodeConfig{NodeName: "n1"},
			eps:  []Endpoint{hinted(e1, []string{"a"}, nil), hinted(e2, []string{"b"}, nil)},
			want: []string{"10.0.0.1", "10.0.0.2"}},
		{name: "not-ready endpoints' hints do not count",
			eps:  []Endpoint{hinted(e1, []string{"a"}, nil), hinted(e2, []string{"b"}, nil), ep("10.0.0.3", "n3", "")},
			want: []string{"10.0.0.1"}},
		{name: "a not-ready endpoint without a node hint leaves node mode alone",
			eps:  []Endpoint{hinted(e1, nil, []string{"n1"}), hinted(e2, nil, []string{"n2"}), ep("10.0.0.3", "n3", "")},
			want: []string{"10.0.0.1"}},
		{name: "a drained endpoint's hints do not count",
			eps:  []Endpoint{weighted(hinted(e1, nil, []string{"n1"}), 0), hinted(e2, nil, []string{"n2"}), hinted(e3, nil, []string{"n3"})},
			want: []string{"10.0.0.2", "10.0.0.3"}},
		{name: "terminating fallback ignores hints",
			eps:  []Endpoint{hinted(ep("10.0.0.1", "n1", "st"), []string{"b"}, nil), hinted(ep("10.0.0.2", "n2", "st"), []string{"a"}, nil)},
			want: []string{"10.0.0.1", "10.0.0.2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			node := zoned
			if tt.node != nil {
				node = *tt.node
			}
			s := Service{Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")}, Ports: []Port{{Protocol: TCP, Port: 80}}, Endpoints: tt.eps}
			assert.Equal(t, tt.want, addrs(compile(t, node, s).Cluster))
		})
	}
}

func TestSelectionPortsAndWeights(t *testing.T) {
	s := Service{
		Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1")},
		Ports: []Port{{Name: "p", Protocol: TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []Endpoint{
			ep("10.0.0.1", "", "rs"),
			{Addr: a("10.0.0.2"), Ports: map[string]uint16{"p": 9090, "other": 1}, Weight: Weight(7)},
			{Addr: a("10.0.0.2"), Ports: map[string]uint16{"p": 9091}},
		},
	}
	sp := compile(t, NodeConfig{}, s)
	want := []Backend{
		{Addr: a("10.0.0.1"), Port: 8080, Weight: 1, Ready: true},
		{Addr: a("10.0.0.2"), Port: 9090, Weight: 7, Ready: true},
		{Addr: a("10.0.0.2"), Port: 9091, Weight: 1, Ready: true},
	}
	if diff := cmp.Diff(want, sp.Cluster, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("backends (-want +got):\n%s", diff)
	}
	s.Ports[0].TargetPort = 0
	if got := compile(t, NodeConfig{}, s).Cluster[0].Port; got != 80 {
		t.Errorf("port without target port: backend port %d, want 80", got)
	}
}

func TestServicePortsPerFamily(t *testing.T) {
	node := NodeConfig{
		NodeIPs:           []netip.Addr{a("192.0.2.1"), a("192.0.2.2"), a("2001:db8::1")},
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.0.2.2/32"), netip.MustParsePrefix("2001:db8::/64")},
	}
	s := Service{
		Name:            "ns/dual",
		ClusterIPs:      []netip.Addr{a("fd00::10"), a("10.96.0.10")},
		ExternalIPs:     []netip.Addr{a("192.0.2.100"), a("2001:db8::100")},
		LoadBalancerIPs: []netip.Addr{a("192.0.2.200")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:1::/48")},
		Ports:           []Port{{Name: "a", Protocol: UDP, Port: 53, NodePort: 30053}, {Name: "b", Protocol: SCTP, Port: 99}},
		Affinity:        SessionAffinity{ClientIP: true},
		Endpoints:       []Endpoint{ep("10.0.0.1", "", "rs"), ep("fd00:1::1", "", "rs")},
	}
	st, err := NewState(node, s)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, sp := range st.Ports() {
		keys = append(keys, sp.Key.String())
		f := sp.Family
		for _, x := range append(append([]netip.Addr{sp.ClusterIP}, sp.ExternalIPs...), sp.LoadBalancerIPs...) {
			if FamilyOf(x) != f {
				t.Errorf("%s: address %s of the wrong family", sp.Key, x)
			}
		}
		for _, b := range sp.Cluster {
			if FamilyOf(b.Addr) != f {
				t.Errorf("%s: backend %s of the wrong family", sp.Key, b)
			}
		}
		if sp.Affinity != DefaultAffinityTimeout {
			t.Errorf("%s: affinity %s, want the default", sp.Key, sp.Affinity)
		}
	}
	want := []string{"ns/dual:a/ipv4", "ns/dual:a/ipv6", "ns/dual:b/ipv4", "ns/dual:b/ipv6"}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	v4 := st.Port(ServicePortKey{"ns/dual", "a", IPv4})
	if diff := cmp.Diff([]string{"192.0.2.2"}, addrStrings(v4.NodeIPs)); diff != "" {
		t.Errorf("node port addresses (-want +got):\n%s", diff)
	}
	if len(v4.SourceRanges) != 1 || v4.SourceRanges[0].String() != "203.0.113.0/24" {
		t.Errorf("source ranges %v", v4.SourceRanges)
	}
	if b := st.Port(ServicePortKey{"ns/dual", "b", IPv4}); len(b.NodeIPs) != 0 {
		t.Errorf("a port without node port has node IPs %v", b.NodeIPs)
	}
}

func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, x := range as {
		out = append(out, x.String())
	}
	return out
}

func TestServiceFamiliesWithoutClusterIP(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1"), a("2001:db8::1")}}
	for _, tt := range []struct {
		name string
		svc  Service
		want []Family
	}{
		{"external IPs only", Service{ExternalIPs: []netip.Addr{a("2001:db8::5")}}, []Family{IPv6}},
		{"node port only", Service{Ports: []Port{{Protocol: TCP, Port: 80, NodePort: 30001}}}, []Family{IPv4, IPv6}},
		{"nothing reachable", Service{}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.svc.Name = "ns/x"
			if tt.svc.Ports == nil {
				tt.svc.Ports = []Port{{Protocol: TCP, Port: 80}}
			}
			st, err := NewState(node, tt.svc)
			if err != nil {
				t.Fatal(err)
			}
			var got []Family
			for _, sp := range st.Ports() {
				got = append(got, sp.Family)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("families (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExternalLocalNeedsExternalAccess(t *testing.T) {
	s := Service{Name: "ns/x", ClusterIPs: []netip.Addr{a("10.96.0.1")}, Ports: []Port{{Protocol: TCP, Port: 80}},
		ExternalTrafficPolicy: PolicyLocal, Endpoints: []Endpoint{ep("10.0.0.1", "elsewhere", "rs")}}
	sp := compile(t, NodeConfig{NodeName: "n1"}, s)
	if sp.ExternallyAccessible() || sp.Internal[FromOutside].Action != ToCluster {
		t.Errorf("a cluster-IP-only port: accessible=%v internal=%v, want false, cluster", sp.ExternallyAccessible(), sp.Internal)
	}
}
