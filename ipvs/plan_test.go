//go:build linux

package ipvs

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

var (
	a    = netip.MustParseAddr
	pfx  = netip.MustParsePrefix
	tcp  = servicelb.TCP
	udp  = servicelb.UDP
	sctp = servicelb.SCTP
)

// testNode is the node of the unit tests: two addresses per family, one of
// each serving node ports, cluster and service CIDRs of both.
func testNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:          "node-a",
		NodeIPs:           []netip.Addr{a("198.51.100.1"), a("192.0.2.1"), a("fd00:c::1")},
		NodePortAddresses: []netip.Prefix{pfx("198.51.100.0/24"), pfx("fd00:c::/64")},
		ClusterCIDRs:      []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:244::/48")},
		ServiceCIDRs:      []netip.Prefix{pfx("10.96.0.0/16"), pfx("fd00:96::/112")},
	}
}

func ep(addr, node string) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: a(addr), NodeName: node}
}

func mustState(t *testing.T, node servicelb.NodeConfig, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(node, svcs...)
	if err != nil {
		t.Fatalf("NewState: %v", err)
	}
	return st
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

func renderCases() map[string][]servicelb.Service {
	w3 := servicelb.Weight(3)
	return map[string][]servicelb.Service{
		"clusterip": {{
			Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.10")},
			Ports:     []servicelb.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{ep("10.244.1.2", "node-a"), ep("10.244.2.2", "node-b")},
		}},
		"dualstack-external-local": {{
			Name: "default/lb", ClusterIPs: []netip.Addr{a("10.96.0.20"), a("fd00:96::20")},
			ExternalIPs:     []netip.Addr{a("203.0.113.7"), a("198.51.100.1")},
			LoadBalancerIPs: []netip.Addr{a("203.0.113.10"), a("2001:db8::10")},
			SourceRanges:    []netip.Prefix{pfx("203.0.113.0/24")},
			Ports: []servicelb.Port{
				{Name: "http", Protocol: tcp, Port: 80, NodePort: 30080, TargetPort: 8080},
				{Name: "dns", Protocol: udp, Port: 53, NodePort: 30053},
			},
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			Endpoints: []servicelb.Endpoint{
				ep("10.244.1.2", "node-a"), ep("10.244.2.2", "node-b"),
				ep("fd00:244:1::2", "node-b"),
			},
		}},
		"scheduler-affinity-weights": {{
			Name: "default/sticky", ClusterIPs: []netip.Addr{a("10.96.0.30")},
			Ports:     []servicelb.Port{{Protocol: sctp, Port: 9000}},
			Scheduler: servicelb.SchedulerWeightedRR,
			Affinity:  servicelb.SessionAffinity{ClientIP: true, Timeout: 90 * time.Second},
			Endpoints: []servicelb.Endpoint{
				{Addr: a("10.244.1.2"), Weight: w3},
				{Addr: a("10.244.2.2")},
				{Addr: a("10.244.3.2"), Weight: servicelb.Weight(0)},
			},
		}, {
			Name: "default/empty", ClusterIPs: []netip.Addr{a("10.96.0.31")},
			Ports: []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30081}},
		}, {
			Name: "default/maglev", ClusterIPs: []netip.Addr{a("10.96.0.32"), a("fd00:96::32")},
			Ports:     []servicelb.Port{{Protocol: udp, Port: 53}},
			Scheduler: servicelb.SchedulerMaglev,
			Affinity:  servicelb.SessionAffinity{ClientIP: true, Timeout: 10 * time.Second},
			Endpoints: []servicelb.Endpoint{ep("10.244.1.2", "node-a"), ep("fd00:244:1::2", "node-a")},
		}},
	}
}

func TestRenderGolden(t *testing.T) {
	for name, svcs := range renderCases() {
		t.Run(name, func(t *testing.T) {
			got, err := Render(mustState(t, testNode(), svcs...), Options{})
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "render-"+name+".golden", got)
		})
	}
}

// TestRenderDetectLocal renders a port whose verdicts differ by origin
// under each other local-traffic detection: the pods' rules match the
// node CIDRs (IPv4 only, so IPv6 has no pods) or the input interface, and
// the node's own flows are never a pod's by interface.
func TestRenderDetectLocal(t *testing.T) {
	for name, d := range map[string]servicelb.DetectLocal{
		"node-cidr": {Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("10.244.9.0/24")}},
		"bridge":    {Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"},
		"prefix":    {Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
	} {
		t.Run(name, func(t *testing.T) {
			n := testNode()
			n.DetectLocal = d
			got, err := Render(mustState(t, n, renderCases()["dualstack-external-local"]...), Options{})
			require.NoError(t, err)
			golden(t, "render-detect-"+name+".golden", got)
		})
	}
}

// TestRenderOrderMatchesIpvsadm checks the order against what ipvsadm
// v1.31 printed for the same virtual servers (its sort compares addresses
// by wrapped 32-bit differences, so 192.168/16 and 198.51/16 come before
// 10/8).
func TestRenderOrderMatchesIpvsadm(t *testing.T) {
	vs := func(addr string, p servicelb.Protocol, port uint16, sched string, persist uint32) *VirtualServer {
		return &VirtualServer{Addr: a(addr), Protocol: p, Port: port, Scheduler: sched, Persistence: persist}
	}
	six := vs("fd00::10", tcp, 80, "mh", 60)
	six.Real = []RealServer{{Addr: a("fd00:244:1::2"), Port: 8080, Weight: 0}}
	got := RenderVirtualServers([]*VirtualServer{
		six, vs("10.96.0.10", sctp, 99, "sh", 0), vs("10.96.0.10", udp, 53, "wrr", 300),
		vs("10.0.0.1", tcp, 30080, "rr", 0), vs("10.96.0.10", tcp, 80, "rr", 0),
		vs("198.51.100.1", tcp, 30080, "rr", 0), vs("192.168.0.1", tcp, 30080, "rr", 0),
	})
	want := `-A -t 192.168.0.1:30080 -s rr
-A -t 198.51.100.1:30080 -s rr
-A -t 10.0.0.1:30080 -s rr
-A -t 10.96.0.10:80 -s rr
-A -u 10.96.0.10:53 -s wrr -p 300
-A --sctp-service 10.96.0.10:99 -s sh
-A -t [fd00::10]:80 -s mh -p 60
-a -t [fd00::10]:80 -r [fd00:244:1::2]:8080 -m -w 0
`
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestPlanRefuses checks what the proxier refuses before the kernel: a
// port its capabilities do not cover (servicelb's error, unchanged), more
// ports needing firewall marks than FWMarkMask holds, and a mask holding
// the masquerade mark.
func TestPlanRefuses(t *testing.T) {
	node := testNode()
	web := servicelb.Service{
		Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.10")},
		Ports: []servicelb.Port{{Name: "http", Protocol: tcp, Port: 80}},
	}
	random := web
	random.Scheduler = servicelb.SchedulerRandom
	local := func(name, lb string) servicelb.Service {
		return servicelb.Service{Name: name, LoadBalancerIPs: []netip.Addr{a(lb)},
			Ports: []servicelb.Port{{Protocol: tcp, Port: 80}}, ExternalTrafficPolicy: servicelb.PolicyLocal,
			Endpoints: []servicelb.Endpoint{ep("10.244.2.2", "node-b")}}
	}
	for _, tc := range []struct {
		name  string
		svcs  []servicelb.Service
		o     Options
		kind  error
		field string
	}{
		{"random scheduler", []servicelb.Service{random}, Options{}, servicelb.ErrUnsupported, "scheduler"},
		{"marks run out", []servicelb.Service{local("default/a", "203.0.113.1"), local("default/b", "203.0.113.2")},
			Options{FWMarkMask: 0x10000}, servicelb.ErrCapacity, "ports"},
		{"mask holds the masquerade mark", []servicelb.Service{web}, Options{FWMarkMask: 0xc000}, ErrInvalidOptions, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(mustState(t, node, tc.svcs...), tc.o)
			require.ErrorIs(t, err, tc.kind)
			if tc.field != "" {
				var ve *servicelb.ValidationError
				require.ErrorAs(t, err, &ve)
				require.Equal(t, tc.field, ve.Field)
			}
		})
	}
}

// TestFrontendClashServed checks that two services asking for one virtual
// server (an external IP that is a node address, on a port another
// service has as node port) are both served, the frontend going to the
// external IP, as servicelb decides.
func TestFrontendClashServed(t *testing.T) {
	ext := servicelb.Service{
		Name: "default/ext", ExternalIPs: []netip.Addr{a("198.51.100.1")},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 30080}}, Endpoints: []servicelb.Endpoint{ep("10.244.1.2", "node-a")},
	}
	np := servicelb.Service{
		Name: "default/np", ClusterIPs: []netip.Addr{a("10.96.0.11")},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30080}}, Endpoints: []servicelb.Endpoint{ep("10.244.2.2", "node-b")},
	}
	o, _ := Options{}.withDefaults()
	p, err := buildModel(mustState(t, testNode(), ext, np), &o)
	require.NoError(t, err)
	k := vsKey{addr: a("198.51.100.1"), proto: tcp, port: 30080}
	require.Equal(t, "default/ext", p.owner[k].Service)
	require.Equal(t, []RealServer{{Addr: a("10.244.1.2"), Port: 30080, Weight: 1}}, p.servers[k].Real)
	require.Contains(t, p.servers, vsKey{addr: a("10.96.0.11"), proto: tcp, port: 80})
}

// TestCapabilities checks what the proxier declares.
func TestCapabilities(t *testing.T) {
	c := (&Proxier{}).Capabilities()
	require.Equal(t, "ipvs", c.Backend)
	require.Equal(t, []servicelb.Scheduler{"rr", "wrr", "lc", "wlc", "sh", "dh", "sed", "nq", "mh"}, c.Schedulers)
	require.Nil(t, c.Protocols)
	require.Zero(t, c.MaxEndpoints)
	lacks := servicelb.FeatureAffinityExpiry | servicelb.FeatureLocalhostNodePorts | servicelb.FeatureLingeringFlows
	require.Equal(t, servicelb.AllFeatures&^(lacks|servicelb.FeatureNoARPAnswers), c.Features,
		"IPVS pins last while its connections do; node ports on localhost are iptables mode's alone; a connection without a server ends; "+
			"the node answers ARP for the dummy link's addresses")
	c = (&Proxier{opts: Options{StrictARP: true}}).Capabilities()
	require.Equal(t, servicelb.AllFeatures&^lacks, c.Features, "with StrictARP the node answers no ARP for them")
}

func TestOptionsRefused(t *testing.T) {
	for _, o := range []Options{
		{Interface: "a-name-much-too-long0"},
		{Interface: "bad name"},
		{SetPrefix: "a-set-prefix-much-too-long-"},
		{ChainPrefix: "A-CHAIN-PREFIX-TOO-LONG-"},
		{GracefulTimeout: -time.Second},
	} {
		if _, err := o.withDefaults(); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: got %v, want ErrInvalidOptions", o, err)
		}
	}
	o, err := Options{}.withDefaults()
	if err != nil || o.Interface != DefaultInterface || o.GracefulTimeout != DefaultGracefulTimeout {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}

func TestSetNamesFit(t *testing.T) {
	o, _ := Options{}.withDefaults()
	for _, f := range []servicelb.Family{servicelb.IPv4, servicelb.IPv6} {
		for _, s := range setSpecs() {
			if n := setName(o.SetPrefix, s.base, f); len(n) > maxSetNameLen || !strings.HasPrefix(n, o.SetPrefix) {
				t.Errorf("set name %q", n)
			}
		}
	}
}

// TestRulesIndependentOfServices checks that the helper rules are the same
// for one service as for a hundred: only the sets grow.
func TestRulesIndependentOfServices(t *testing.T) {
	rules := func(n int) string {
		var svcs []servicelb.Service
		for i := range n {
			svcs = append(svcs, servicelb.Service{
				Name:            fmt.Sprintf("ns/svc-%d", i),
				ClusterIPs:      []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 1, byte(i)})},
				LoadBalancerIPs: []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})},
				SourceRanges:    []netip.Prefix{pfx("192.0.2.0/24")},
				Ports:           []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: uint16(30000 + i)}},
				Endpoints:       []servicelb.Endpoint{ep(fmt.Sprintf("10.244.%d.2", i), "node-a")},
			})
		}
		text, err := Render(mustState(t, testNode(), svcs...), Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, rules, _ := strings.Cut(text, SectionRules4)
		return rules
	}
	one, many := rules(1), rules(100)
	if one != many {
		t.Errorf("rules differ between 1 and 100 services:\n%s", cmp.Diff(one, many))
	}
	if n := strings.Count(one, "\n-A "); n != 68 {
		t.Errorf("%d rules, want 68 (34 per family)", n)
	}
}

// TestSteersOnlyWhereVerdictsDiffer checks that a port gets rules of its
// own only where an origin's verdict differs from the outside verdict of
// a frontend: under the external Local policy, one rule per external
// frontend for pods and one for the node, and none under Cluster.
func TestSteersOnlyWhereVerdictsDiffer(t *testing.T) {
	svc := func(policy servicelb.TrafficPolicy) servicelb.Service {
		return servicelb.Service{
			Name: "default/lb", ClusterIPs: []netip.Addr{a("10.96.0.10")},
			LoadBalancerIPs: []netip.Addr{a("203.0.113.10")}, ExternalIPs: []netip.Addr{a("203.0.113.7")},
			Ports:                 []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30080}},
			ExternalTrafficPolicy: policy,
			Endpoints:             []servicelb.Endpoint{ep("10.244.1.2", "node-a"), ep("10.244.2.2", "node-b")},
		}
	}
	o, _ := Options{}.withDefaults()
	for policy, want := range map[servicelb.TrafficPolicy][2]int{
		servicelb.PolicyCluster: {0, 0},
		// The LB IP, the external IP and one node address serving node ports.
		servicelb.PolicyLocal: {3, 3},
	} {
		p, err := buildModel(mustState(t, testNode(), svc(policy)), &o)
		require.NoError(t, err)
		steers := p.steerRules(servicelb.IPv4)
		require.Equal(t, want, [2]int{len(steers[0]["default/lb:/ipv4"]), len(steers[1]["default/lb:/ipv4"])}, "policy %s", policy)
		fw := 0
		for k, vs := range p.servers {
			if k.fwmark != 0 {
				fw++
				require.Len(t, vs.Real, 2, "firewall-mark virtual server %s takes the cluster set", k)
			}
		}
		require.Equal(t, min(want[0], 2), fw, "policy %s: firewall-mark virtual servers (pods', node's)", policy)
	}
}

// TestOwnsChain checks that the proxier owns exactly its helper chains.
func TestOwnsChain(t *testing.T) {
	owns := ownsChain(DefaultChainPrefix)
	for chain, want := range map[string]bool{
		"KPROXY-IPVS-SERVICES": true, "KPROXY-IPVS-SOURCE-RANGES": true, "KPROXY-IPVS-X": false,
		"KPROXY-SERVICES": false, "INPUT": false, "KPROXY-IPVS-SVC-ABCDEFGHIJKLMNOP": false,
	} {
		if got := owns("nat", chain); got != want {
			t.Errorf("owns(%q) = %v, want %v", chain, got, want)
		}
	}
}
