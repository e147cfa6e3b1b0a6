package servicelb

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func keys(sps []*ServicePort) []string {
	out := []string{}
	for _, sp := range sps {
		out = append(out, sp.Key.String())
	}
	return out
}

func changedKeys(cs []PortChange) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.New.Key.String())
	}
	return out
}

func simple(name, vip string, eps ...string) Service {
	s := Service{Name: name, ClusterIPs: []netip.Addr{a(vip)}, Ports: []Port{
		{Name: "tcp", Protocol: TCP, Port: 80}, {Name: "udp", Protocol: UDP, Port: 53},
	}}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, Endpoint{Addr: a(e)})
	}
	return s
}

func TestDiff(t *testing.T) {
	b, _ := NewBuilder(NodeConfig{})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.Upsert(simple("a", "10.96.0.1", "10.0.0.1")))
	must(b.Upsert(simple("b", "10.96.0.2", "10.0.0.2")))
	s0 := b.State()

	all := Diff(nil, s0)
	if !all.NodeChanged || len(all.Added) != 4 || len(all.Removed)+len(all.Changed) != 0 {
		t.Fatalf("diff from nil: %+v", all)
	}
	if c := Diff(s0, s0); !c.Empty() {
		t.Fatalf("diff of a state with itself: %+v", c)
	}

	// A no-op upsert changes nothing, not even the State's identity.
	must(b.Upsert(simple("a", "10.96.0.1", "10.0.0.1")))
	if b.State() != s0 {
		t.Fatal("a no-op upsert made a new state")
	}

	// Change one port of a (only the UDP port's target), delete b, add c.
	ca := simple("a", "10.96.0.1", "10.0.0.1")
	ca.Ports[1].TargetPort = 5353
	must(b.Upsert(ca))
	b.Delete("b")
	must(b.Upsert(simple("c", "10.96.0.3")))
	s1 := b.State()
	c := Diff(s0, s1)
	if c.NodeChanged {
		t.Error("node reported changed")
	}
	for _, x := range []struct {
		what      string
		want, got []string
	}{
		{"added", []string{"c:tcp/ipv4", "c:udp/ipv4"}, keys(c.Added)},
		{"removed", []string{"b:tcp/ipv4", "b:udp/ipv4"}, keys(c.Removed)},
		{"changed", []string{"a:udp/ipv4"}, changedKeys(c.Changed)},
	} {
		if diff := cmp.Diff(x.want, x.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", x.what, diff)
		}
	}
	if c.Len() != 5 {
		t.Errorf("Len = %d", c.Len())
	}

	// The old state is untouched by the builder's later changes.
	if s0.Len() != 2 || s0.Port(ServicePortKey{"b", "tcp", IPv4}) == nil || s0.Port(ServicePortKey{"a", "udp", IPv4}).Port.TargetPort != 0 {
		t.Error("a later change leaked into an earlier state")
	}
}

func TestDiffNodeChange(t *testing.T) {
	b, _ := NewBuilder(NodeConfig{NodeName: "n1"})
	s := simple("a", "10.96.0.1")
	s.Endpoints = []Endpoint{{Addr: a("10.0.0.1"), NodeName: "n2"}}
	s.Ports[0].NodePort = 30000
	if err := b.Upsert(s); err != nil {
		t.Fatal(err)
	}
	s0 := b.State()
	if err := b.SetNode(NodeConfig{NodeName: "n2"}); err != nil {
		t.Fatal(err)
	}
	c := Diff(s0, b.State())
	if !c.NodeChanged || len(c.Changed) != 2 {
		t.Fatalf("after a node change: NodeChanged=%v changed=%v", c.NodeChanged, changedKeys(c.Changed))
	}
	if !b.State().Port(ServicePortKey{"a", "tcp", IPv4}).Local[0].Local {
		t.Error("endpoint not local on its node after SetNode")
	}
	if err := b.SetNode(NodeConfig{NodePortRange: PortRange{Min: 31000, Max: 32000}}); err == nil {
		t.Error("SetNode accepted a node port range that excludes a service's node port")
	} else if b.State().Node().NodeName != "n2" {
		t.Error("a failed SetNode changed the node")
	}
}

func TestStaleFlows(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1")}}
	svc := func(eps ...Endpoint) Service {
		return Service{
			Name: "ns/dns", ClusterIPs: []netip.Addr{a("10.96.0.10")}, ExternalIPs: []netip.Addr{a("192.0.2.10")},
			Ports:     []Port{{Name: "udp", Protocol: UDP, Port: 53, NodePort: 30053}, {Name: "tcp", Protocol: TCP, Port: 53}},
			Endpoints: eps,
		}
	}
	retargeted := func(eps ...Endpoint) Service {
		s := svc(eps...)
		s.Ports[0].TargetPort = 5353
		return s
	}
	ready := func(addr string) Endpoint { return Endpoint{Addr: a(addr)} }
	terminating := func(addr string) Endpoint {
		return Endpoint{Addr: a(addr), Ready: new(false), Serving: new(true), Terminating: true}
	}
	state := func(s ...Service) *State {
		st, err := NewState(node, s...)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	flows := func(from, to *State) []string {
		c := Diff(from, to)
		out := []string{}
		for _, f := range c.StaleFlows() {
			out = append(out, fmt.Sprintf("%s %v:%d keep=%v", f.Protocol, f.Dst, f.Port, f.Serving))
		}
		return out
	}
	all := func(keep string) []string {
		return []string{
			"UDP 10.96.0.10:53 keep=" + keep, "UDP 192.0.2.1:30053 keep=" + keep, "UDP 192.0.2.10:53 keep=" + keep,
		}
	}
	empty, one, two := state(svc()), state(svc(ready("10.0.0.1"))), state(svc(ready("10.0.0.1"), ready("10.0.0.2")))
	for _, tt := range []struct {
		name     string
		from, to *State
		want     []string
	}{
		{"endpoint removed", two, one, all("[10.0.0.1:53]")},
		{"endpoint added", one, two, []string{}},
		{"first endpoint", empty, one, all("[10.0.0.1:53]")},
		// A frontend left without a serving endpoint, or gone, keeps
		// its flows until they idle out (kube-proxy 1.31 on).
		{"service removed", one, state(), []string{}},
		{"last endpoint removed", one, empty, []string{}},
		{"last endpoint stops serving", one, state(svc(Endpoint{Addr: a("10.0.0.1"), Ready: new(false), Serving: new(false)})), []string{}},
		{"port removed", one, state(Service{Name: "ns/dns", ClusterIPs: []netip.Addr{a("10.96.0.10")},
			Ports: []Port{{Name: "tcp", Protocol: TCP, Port: 53}}, Endpoints: []Endpoint{ready("10.0.0.1")}}), []string{}},
		{"new service with endpoints", state(), one, all("[10.0.0.1:53]")},
		// The endpoint serves on another port: its flows to the old
		// one are stale, as kube-proxy reads a flow's reply source
		// address and port.
		{"target port changed", one, state(retargeted(ready("10.0.0.1"))), all("[10.0.0.1:5353]")},
		{"new service without endpoints", state(), empty, []string{}},
		// A serving, terminating endpoint is deselected once another
		// is ready; its flows stay.
		{"terminating endpoint deselected but serving", state(svc(terminating("10.0.0.1"))),
			state(svc(terminating("10.0.0.1"), ready("10.0.0.2"))), []string{}},
		{"endpoint drained by weight 0", one, state(svc(Endpoint{Addr: a("10.0.0.1"), Weight: Weight(0)})), []string{}},
		{"endpoint stops serving", state(svc(terminating("10.0.0.1"), ready("10.0.0.2"))), two,
			all("[10.0.0.1:53 10.0.0.2:53]")[:0]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, flows(tt.from, tt.to)); diff != "" {
				t.Errorf("stale flows (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStaleFlowsOfState: a state lists every UDP and SCTP frontend that
// endpoints serve, with them, to reconcile a whole conntrack table.
func TestStaleFlowsOfState(t *testing.T) {
	st, err := NewState(NodeConfig{}, Service{
		Name: "ns/x", ClusterIPs: []netip.Addr{a("10.96.0.1")},
		Ports:     []Port{{Name: "u", Protocol: UDP, Port: 53}, {Name: "s", Protocol: SCTP, Port: 99}, {Name: "t", Protocol: TCP, Port: 80}},
		Endpoints: []Endpoint{{Addr: a("10.0.0.2")}, {Addr: a("10.0.0.1"), Ready: new(false), Serving: new(true), Terminating: true}},
	}, Service{
		// No endpoint serves it: its flows stay, whatever they reach.
		Name: "ns/y", ClusterIPs: []netip.Addr{a("10.96.0.2")}, Ports: []Port{{Name: "u", Protocol: UDP, Port: 53}},
		Endpoints: []Endpoint{{Addr: a("10.0.0.3"), Ready: new(false), Serving: new(false)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []StaleFlow{
		{Protocol: SCTP, Dst: a("10.96.0.1"), Port: 99, Serving: []netip.AddrPort{ap("10.0.0.1", 99), ap("10.0.0.2", 99)}},
		{Protocol: UDP, Dst: a("10.96.0.1"), Port: 53, Serving: []netip.AddrPort{ap("10.0.0.1", 53), ap("10.0.0.2", 53)}},
	}
	if diff := cmp.Diff(want, st.StaleFlows(), cmp.Comparer(func(x, y netip.Addr) bool { return x == y }),
		cmp.Comparer(func(x, y netip.AddrPort) bool { return x == y })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if !want[0].Keeps(ap("10.0.0.2", 99)) || want[0].Keeps(ap("10.0.0.3", 99)) || want[0].Keeps(ap("10.0.0.2", 98)) {
		t.Error("Keeps")
	}
}

// TestDiffSeesEveryField: a change of any input a backend reads shows in
// Diff, including those a backend once read past the compiled port.
func TestDiffSeesEveryField(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1"), a("2001:db8::1")}}
	base := Service{
		Name: "ns/lb", ClusterIPs: []netip.Addr{a("10.96.0.1")}, LoadBalancerIPs: []netip.Addr{a("203.0.113.1")},
		Ports:                 []Port{{Name: "p", Protocol: TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: PolicyLocal, HealthCheckNodePort: 30100,
		Endpoints: []Endpoint{{Addr: a("10.0.0.1")}},
	}
	for _, tt := range []struct {
		name string
		edit func(*Service)
	}{
		{"health check node port", func(s *Service) { s.HealthCheckNodePort = 30101 }},
		{"source ranges of the port's family", func(s *Service) { s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")} }},
		{"scheduler", func(s *Service) { s.Scheduler = SchedulerRoundRobin }},
		{"affinity", func(s *Service) { s.Affinity = SessionAffinity{ClientIP: true} }},
		{"serving endpoint", func(s *Service) {
			s.Endpoints = append(s.Endpoints, Endpoint{Addr: a("10.0.0.9"), Ready: new(false), Serving: new(true), Terminating: true})
		}},
		{"load-balancer IP mode Proxy", func(s *Service) {
			s.LoadBalancerIPs, s.ProxiedLoadBalancerIPs = nil, s.LoadBalancerIPs
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			s.Endpoints = slices.Clone(base.Endpoints)
			tt.edit(&s)
			from, to := mustNewState(t, node, base), mustNewState(t, node, s)
			if c := Diff(from, to); c.Empty() {
				t.Error("Diff is empty")
			}
		})
	}
	// Source ranges of the other family change no port.
	s := base
	s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:5::/48")}
	if c := Diff(mustNewState(t, node, base), mustNewState(t, node, s)); !c.Empty() {
		t.Errorf("IPv6 ranges changed an IPv4-only service: %+v", c)
	}
}

func mustNewState(t *testing.T, node NodeConfig, svcs ...Service) *State {
	t.Helper()
	st, err := NewState(node, svcs...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestStateOwnsItsData(t *testing.T) {
	s := simple("a", "10.96.0.1", "10.0.0.1")
	s.Endpoints[0].Ports = map[string]uint16{"tcp": 8080}
	st, err := NewState(NodeConfig{}, s)
	if err != nil {
		t.Fatal(err)
	}
	s.ClusterIPs[0] = a("10.96.0.99")
	s.Ports[0].Port = 81
	s.Endpoints[0].Ports["tcp"] = 9090
	s.Endpoints[0].Addr = a("10.0.0.99")
	got, _ := st.Service("a")
	if got.ClusterIPs[0] != a("10.96.0.1") || got.Ports[0].Port != 80 || got.Endpoints[0].Ports["tcp"] != 8080 || got.Endpoints[0].Addr != a("10.0.0.1") {
		t.Fatalf("the caller's later edits reached the state: %+v", got)
	}
	if got.InternalTrafficPolicy != PolicyCluster || got.ExternalTrafficPolicy != PolicyCluster {
		t.Errorf("defaults not applied: %+v", got)
	}
}

// TestEndpointsOnly: a change of a port's endpoints that leaves its
// verdicts alone is one of its endpoints alone; a change that also moves
// a verdict, a frontend or any other field is not, even when the
// endpoints change with it.
func TestEndpointsOnly(t *testing.T) {
	node := NodeConfig{NodeName: "n1", NodeIPs: []netip.Addr{a("192.0.2.1")}}
	base := Service{
		Name: "ns/web", ClusterIPs: []netip.Addr{a("10.96.0.1")},
		Ports:                 []Port{{Name: "p", Protocol: TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: PolicyLocal,
		Endpoints: []Endpoint{
			{Addr: a("10.0.0.1"), NodeName: "n1"},
			{Addr: a("10.0.0.2"), NodeName: "n2"},
		},
	}
	for _, tt := range []struct {
		name string
		edit func(*Service)
		want bool
	}{
		{"an endpoint replaced", func(s *Service) { s.Endpoints[1].Addr = a("10.0.0.3") }, true},
		{"an endpoint added", func(s *Service) {
			s.Endpoints = append(s.Endpoints, Endpoint{Addr: a("10.0.0.4"), NodeName: "n2"})
		}, true},
		{"a weight", func(s *Service) { s.Endpoints[1].Weight = Weight(3) }, true},
		{"a serving endpoint beside ready ones", func(s *Service) {
			s.Endpoints = append(s.Endpoints, Endpoint{Addr: a("10.0.0.9"), Ready: new(false), Serving: new(true), Terminating: true})
		}, true},
		{"the last local endpoint gone: the external verdict drops", func(s *Service) { s.Endpoints = s.Endpoints[1:] }, false},
		{"every endpoint gone: the verdicts reject", func(s *Service) { s.Endpoints = nil }, false},
		{"a port number with an endpoint", func(s *Service) {
			s.Ports = []Port{{Name: "p", Protocol: TCP, Port: 81, NodePort: 30080}}
			s.Endpoints[1].Addr = a("10.0.0.3")
		}, false},
		{"affinity", func(s *Service) { s.Affinity = SessionAffinity{ClientIP: true} }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			s.Endpoints = slices.Clone(base.Endpoints)
			tt.edit(&s)
			c := Diff(mustNewState(t, node, base), mustNewState(t, node, s))
			if len(c.Changed) != 1 || len(c.Added)+len(c.Removed) != 0 {
				t.Fatalf("want one port changed, got %+v", c)
			}
			if got := c.Changed[0].EndpointsOnly(); got != tt.want {
				t.Errorf("EndpointsOnly() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestSamePortSeesEveryField: a change of any field of a ServicePort makes
// it another port, so that Diff reports it; a field added to ServicePort
// fails this test until ServicePort.Equal compares it.
func TestSamePortSeesEveryField(t *testing.T) {
	base := ServicePort{Key: ServicePortKey{Service: "ns/a", Port: "p", Family: IPv4}, Port: Port{Name: "p", Protocol: TCP, Port: 80},
		Family: IPv4, ClusterIP: a("10.96.0.1")}
	edits := map[string]func(*ServicePort){
		"Key":                 func(sp *ServicePort) { sp.Key.Port = "q" },
		"Port":                func(sp *ServicePort) { sp.Port.TargetPort = 8080 },
		"Family":              func(sp *ServicePort) { sp.Family = IPv6 },
		"ClusterIP":           func(sp *ServicePort) { sp.ClusterIP = a("10.96.0.2") },
		"ExternalIPs":         func(sp *ServicePort) { sp.ExternalIPs = []netip.Addr{a("203.0.113.1")} },
		"LoadBalancerIPs":     func(sp *ServicePort) { sp.LoadBalancerIPs = []netip.Addr{a("203.0.113.2")} },
		"NodeIPs":             func(sp *ServicePort) { sp.NodeIPs = []netip.Addr{a("192.0.2.1")} },
		"Cluster":             func(sp *ServicePort) { sp.Cluster = []Backend{{Addr: a("10.0.0.1"), Port: 80, Weight: 1}} },
		"Local":               func(sp *ServicePort) { sp.Local = []Backend{{Addr: a("10.0.0.1"), Port: 80, Weight: 1}} },
		"Internal":            func(sp *ServicePort) { sp.Internal[FromPod].Action = ToCluster },
		"External":            func(sp *ServicePort) { sp.External[FromNode].Masquerade = true },
		"SourceRanges":        func(sp *ServicePort) { sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")} },
		"Affinity":            func(sp *ServicePort) { sp.Affinity = time.Hour },
		"Scheduler":           func(sp *ServicePort) { sp.Scheduler = SchedulerRoundRobin },
		"HealthCheckNodePort": func(sp *ServicePort) { sp.HealthCheckNodePort = 30100 },
		"Hairpin":             func(sp *ServicePort) { sp.Hairpin = []netip.Addr{a("10.0.0.1")} },
		"Serving":             func(sp *ServicePort) { sp.Serving = []netip.AddrPort{ap("10.0.0.1", 80)} },
		"moreServing":         func(sp *ServicePort) { sp.moreServing = []netip.AddrPort{ap("10.0.0.1", 80)} },
	}
	typ := reflect.TypeFor[ServicePort]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		edit, ok := edits[name]
		if !ok {
			t.Errorf("field %s: no edit here; make ServicePort.Equal compare it, then add one", name)
			continue
		}
		sp := base
		edit(&sp)
		if base.Equal(&sp) || sp.Equal(&base) {
			t.Errorf("field %s: a change is not seen", name)
		}
	}
	if len(edits) != typ.NumField() {
		t.Errorf("%d edits for %d fields", len(edits), typ.NumField())
	}
	same := base
	same.ExternalIPs = []netip.Addr{}
	if !base.Equal(&same) {
		t.Error("an empty list differs from none")
	}
}

// ap is an endpoint at a port, as ServicePort.Serving and StaleFlow.Serving
// list them.
func ap(addr string, port uint16) netip.AddrPort { return netip.AddrPortFrom(a(addr), port) }
