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
// each serving node ports.
func testNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:          "node-a",
		NodeIPs:           []netip.Addr{a("198.51.100.1"), a("192.0.2.1"), a("fd00:c::1")},
		NodePortAddresses: []netip.Prefix{pfx("198.51.100.0/24"), pfx("fd00:c::/64")},
		ClusterCIDRs:      []netip.Prefix{pfx("10.244.0.0/16"), pfx("fd00:244::/48")},
	}
}

func ep(addr, node string) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: a(addr), Ready: true, Serving: true, NodeName: node}
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
				{Addr: a("10.244.1.2"), Ready: true, Weight: w3},
				{Addr: a("10.244.2.2"), Ready: true},
				{Addr: a("10.244.3.2"), Ready: true, Weight: servicelb.Weight(0)},
			},
		}, {
			Name: "default/empty", ClusterIPs: []netip.Addr{a("10.96.0.31")},
			Ports: []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30081}},
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

func TestPlanRefuses(t *testing.T) {
	node := testNode()
	web := servicelb.Service{
		Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.10")},
		Ports: []servicelb.Port{{Name: "http", Protocol: tcp, Port: 80}},
	}
	random := web
	random.Scheduler = servicelb.SchedulerRandom
	// An external IP that is a node address, on a port another service
	// uses as node port: both need virtual server 198.51.100.1:30080.
	ext := servicelb.Service{
		Name: "default/ext", ExternalIPs: []netip.Addr{a("198.51.100.1")},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 30080}},
	}
	np := servicelb.Service{
		Name: "default/np", ClusterIPs: []netip.Addr{a("10.96.0.11")},
		Ports: []servicelb.Port{{Protocol: tcp, Port: 80, NodePort: 30080}},
	}
	for _, tc := range []struct {
		name  string
		svcs  []servicelb.Service
		kind  error
		field string
	}{
		{"random scheduler", []servicelb.Service{random}, ErrUnsupported, "scheduler"},
		{"external IP on a node port", []servicelb.Service{ext, np}, ErrConflict, "ports[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(mustState(t, node, tc.svcs...), Options{})
			if !errors.Is(err, tc.kind) {
				t.Fatalf("Render: %v, want %v", err, tc.kind)
			}
			var ve *servicelb.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Fatalf("Render: %v, want a ValidationError on %s", err, tc.field)
			}
		})
	}
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

func TestPersistenceRoundsUp(t *testing.T) {
	for d, want := range map[time.Duration]uint32{0: 0, time.Second: 1, 1500 * time.Millisecond: 2, 3 * time.Hour: 10800} {
		if got := persistence(d); got != want {
			t.Errorf("persistence(%s) = %d, want %d", d, got, want)
		}
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
	if n := strings.Count(one, "\n-A "); n != 48 {
		t.Errorf("%d rules, want 48 (24 per family)", n)
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
