package servicelb

import (
	"errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var a = netip.MustParseAddr

func baseService() Service {
	return Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{a("10.96.0.10"), a("fd00:96::10")},
		Ports: []Port{
			{Name: "http", Protocol: TCP, Port: 80, TargetPort: 8080, NodePort: 30080},
			{Name: "dns", Protocol: UDP, Port: 53},
		},
		Endpoints: []Endpoint{
			{Addr: a("10.244.1.2"), NodeName: "n1"},
		},
	}
}

func TestValidateAccepts(t *testing.T) {
	node := NodeConfig{}
	s := baseService()
	s.ExternalIPs = []netip.Addr{a("192.0.2.10")}
	s.LoadBalancerIPs = []netip.Addr{a("192.0.2.11")}
	s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	s.Affinity = SessionAffinity{ClientIP: true, Timeout: time.Minute}
	s.ExternalTrafficPolicy = PolicyLocal
	s.HealthCheckNodePort = 30999
	s.Scheduler = SchedulerMaglev
	if err := Validate(&node, &s); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

// A node config without a node port range bounds no node port, as
// kube-proxy knows no range: a cluster that widened the API server's
// range (80-32767, 30000-40000) has its node ports served.
func TestValidateNoNodePortRange(t *testing.T) {
	for _, port := range []uint16{80, 20080, 40000} {
		s := baseService()
		s.Ports[0].NodePort = port
		s.ExternalTrafficPolicy = PolicyLocal
		s.HealthCheckNodePort = port + 1
		require.NoError(t, Validate(&NodeConfig{}, &s), "node port %d", port)
	}
}

func TestValidateRejects(t *testing.T) {
	long := strings.Repeat("x", MaxNameLen+1)
	tests := []struct {
		name   string
		edit   func(*Service)
		node   NodeConfig
		kind   error
		field  string
		substr string
	}{
		{"empty name", func(s *Service) { s.Name = "" }, NodeConfig{}, ErrInvalidName, "name", ""},
		{"bad name", func(s *Service) { s.Name = "web svc" }, NodeConfig{}, ErrInvalidName, "name", ""},
		{"long name", func(s *Service) { s.Name = long }, NodeConfig{}, ErrNameTooLong, "name", "129 bytes"},
		{"long port name", func(s *Service) { s.Ports[0].Name = strings.Repeat("p", 64) }, NodeConfig{}, ErrNameTooLong, "ports[0].name", ""},
		{"bad port name", func(s *Service) { s.Ports[0].Name = "a/b" }, NodeConfig{}, ErrInvalidName, "ports[0].name", ""},
		{"missing cluster IP", func(s *Service) { s.ClusterIPs[0] = netip.Addr{} }, NodeConfig{}, ErrInvalidAddress, "clusterIPs[0]", "missing"},
		{"unspecified cluster IP", func(s *Service) { s.ClusterIPs[0] = a("0.0.0.0") }, NodeConfig{}, ErrInvalidAddress, "clusterIPs[0]", "unspecified"},
		{"unspecified v6", func(s *Service) { s.ClusterIPs[1] = a("::") }, NodeConfig{}, ErrInvalidAddress, "clusterIPs[1]", "unspecified"},
		{"loopback external IP", func(s *Service) { s.ExternalIPs = []netip.Addr{a("127.0.0.1")} }, NodeConfig{}, ErrInvalidAddress, "externalIPs[0]", "loopback"},
		{"multicast LB IP", func(s *Service) { s.LoadBalancerIPs = []netip.Addr{a("224.0.0.1")} }, NodeConfig{}, ErrInvalidAddress, "loadBalancerIPs[0]", "multicast"},
		{"mapped address", func(s *Service) { s.ClusterIPs[1] = a("::ffff:10.0.0.1") }, NodeConfig{}, ErrInvalidAddress, "clusterIPs[1]", "IPv4-mapped"},
		{"zoned address", func(s *Service) { s.ClusterIPs[1] = a("fe80::1%eth0") }, NodeConfig{}, ErrInvalidAddress, "clusterIPs[1]", "zoned"},
		{"endpoint address", func(s *Service) { s.Endpoints[0].Addr = netip.Addr{} }, NodeConfig{}, ErrInvalidAddress, "endpoints[0].addr", ""},
		{"endpoint port 0", func(s *Service) { s.Endpoints[0].Ports = map[string]uint16{"http": 0} }, NodeConfig{}, ErrInvalidPort, `endpoints[0].ports["http"]`, ""},
		{"duplicate address", func(s *Service) { s.ExternalIPs = []netip.Addr{a("10.96.0.10")} }, NodeConfig{}, ErrDuplicateAddress, "externalIPs[0]", "clusterIPs[0]"},
		{"proxied load-balancer IP also captured", func(s *Service) {
			s.LoadBalancerIPs, s.ProxiedLoadBalancerIPs = []netip.Addr{a("203.0.113.1")}, []netip.Addr{a("203.0.113.1")}
		}, NodeConfig{}, ErrDuplicateAddress, "proxiedLoadBalancerIPs[0]", "loadBalancerIPs[0]"},
		{"bad proxied load-balancer IP", func(s *Service) { s.ProxiedLoadBalancerIPs = []netip.Addr{a("127.0.0.1")} }, NodeConfig{}, ErrInvalidAddress, "proxiedLoadBalancerIPs[0]", ""},
		{"two IPv4 cluster IPs", func(s *Service) { s.ClusterIPs[1] = a("10.96.0.11") }, NodeConfig{}, ErrFamilyMismatch, "clusterIPs[1]", ""},
		{"three cluster IPs", func(s *Service) { s.ClusterIPs = append(s.ClusterIPs, a("10.96.0.12")) }, NodeConfig{}, ErrFamilyMismatch, "clusterIPs", ""},
		{"bad source range", func(s *Service) { s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")} }, NodeConfig{}, ErrInvalidPrefix, "sourceRanges[0]", "10.0.0.0/8"},
		{"no ports", func(s *Service) { s.Ports = nil }, NodeConfig{}, ErrInvalidPort, "ports", ""},
		{"port 0", func(s *Service) { s.Ports[1].Port = 0 }, NodeConfig{}, ErrInvalidPort, "ports[1].port", ""},
		{"node port below range", func(s *Service) { s.Ports[0].NodePort = 80 }, NodeConfig{NodePortRange: PortRange{Min: 30000, Max: 32767}}, ErrNodePortRange, "ports[0].nodePort", "30000-32767"},
		{"node port outside custom range", func(s *Service) {}, NodeConfig{NodePortRange: PortRange{Min: 31000, Max: 31999}}, ErrNodePortRange, "ports[0].nodePort", "31000-31999"},
		{"health check port", func(s *Service) { s.HealthCheckNodePort = 1 }, NodeConfig{NodePortRange: PortRange{Min: 30000, Max: 32767}}, ErrNodePortRange, "healthCheckNodePort", ""},
		{"duplicate port name", func(s *Service) { s.Ports[1].Name = "http" }, NodeConfig{}, ErrDuplicatePortName, "ports[1].name", "ports[0]"},
		{"duplicate port", func(s *Service) { s.Ports[1].Protocol, s.Ports[1].Port = TCP, 80 }, NodeConfig{}, ErrDuplicatePort, "ports[1].port", ""},
		{"duplicate node port", func(s *Service) { s.Ports[1].Protocol, s.Ports[1].NodePort = TCP, 30080 }, NodeConfig{}, ErrDuplicatePort, "ports[1].nodePort", ""},
		{"unknown protocol", func(s *Service) { s.Ports[0].Protocol = "ICMP" }, NodeConfig{}, ErrUnknownProtocol, "ports[0].protocol", "ICMP"},
		{"lower-case protocol", func(s *Service) { s.Ports[0].Protocol = "tcp" }, NodeConfig{}, ErrUnknownProtocol, "ports[0].protocol", ""},
		{"bad policy", func(s *Service) { s.ExternalTrafficPolicy = "Nearby" }, NodeConfig{}, ErrInvalidPolicy, "externalTrafficPolicy", ""},
		{"affinity too short", func(s *Service) { s.Affinity = SessionAffinity{ClientIP: true, Timeout: time.Millisecond} }, NodeConfig{}, ErrAffinityTimeout, "affinity.timeout", ""},
		{"affinity too long", func(s *Service) { s.Affinity = SessionAffinity{ClientIP: true, Timeout: 25 * time.Hour} }, NodeConfig{}, ErrAffinityTimeout, "affinity.timeout", ""},
		{"timeout without affinity", func(s *Service) { s.Affinity = SessionAffinity{Timeout: time.Hour} }, NodeConfig{}, ErrAffinityTimeout, "affinity.timeout", "without ClientIP"},
		{"unknown scheduler", func(s *Service) { s.Scheduler = "fastest" }, NodeConfig{}, ErrUnknownScheduler, "scheduler", "fastest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := baseService()
			tt.edit(&s)
			err := Validate(&tt.node, &s)
			checkValidation(t, err, tt.kind, s.Name, tt.field, tt.substr)
		})
	}
}

func checkValidation(t *testing.T, err, kind error, svc, field, substr string) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	if !errors.Is(err, kind) {
		t.Fatalf("error %q is not %v", err, kind)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %q is not a *ValidationError", err)
	}
	if ve.Service != svc || ve.Field != field {
		t.Errorf("error names service %q field %q, want %q %q (%v)", ve.Service, ve.Field, svc, field, err)
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("error %q does not mention %q", err, substr)
	}
	if svc != "" && !strings.Contains(err.Error(), svc) {
		t.Errorf("error %q does not name the service", err)
	}
}

func TestValidateReportsEveryMistake(t *testing.T) {
	s := baseService()
	s.Ports[0].Port = 0
	s.Ports[1].Protocol = "ICMP"
	s.ClusterIPs[0] = a("0.0.0.0")
	err := Validate(&NodeConfig{}, &s)
	for _, kind := range []error{ErrInvalidPort, ErrUnknownProtocol, ErrInvalidAddress} {
		if !errors.Is(err, kind) {
			t.Errorf("joined error %q lacks %v", err, kind)
		}
	}
}

func TestValidateNode(t *testing.T) {
	tests := []struct {
		name  string
		node  NodeConfig
		kind  error
		field string
	}{
		{"node IP", NodeConfig{NodeIPs: []netip.Addr{a("0.0.0.0")}}, ErrInvalidAddress, "nodeIPs[0]"},
		{"cluster CIDR", NodeConfig{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/16")}}, ErrInvalidPrefix, "clusterCIDRs[0]"},
		{"service CIDR", NodeConfig{ServiceCIDRs: []netip.Prefix{{}}}, ErrInvalidPrefix, "serviceCIDRs[0]"},
		{"node port range", NodeConfig{NodePortRange: PortRange{Min: 200, Max: 100}}, ErrInvalidNode, "nodePortRange"},
		{"masquerade bit", NodeConfig{MasqueradeBit: 32}, ErrInvalidNode, "masqueradeBit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateNode(&tt.node)
			checkValidation(t, err, tt.kind, "", tt.field, "")
			if _, err := NewState(tt.node); !errors.Is(err, tt.kind) {
				t.Errorf("NewState: %v, want %v", err, tt.kind)
			}
		})
	}
}

// TestConflicts: a frontend two services ask for goes to one of them by
// rule, whatever the order they arrive in, and the clash is reported; the
// other keeps everything else, its cluster IP included.
func TestConflicts(t *testing.T) {
	node := NodeConfig{NodeIPs: []netip.Addr{a("192.0.2.1"), a("192.0.2.2")}}
	other := func(name string, edit func(*Service)) Service {
		s := Service{Name: name, ClusterIPs: []netip.Addr{a("10.96.0.20")}, Ports: []Port{{Name: "http", Protocol: TCP, Port: 80}},
			Endpoints: []Endpoint{{Addr: a("10.244.2.2")}}}
		edit(&s)
		return s
	}
	web := ServicePortKey{"default/web", "http", IPv4}
	tests := []struct {
		name     string
		svc      Service
		frontend string
		winner   string
		check    func(t *testing.T, st *State)
	}{
		{"same cluster IP and port: the first name wins",
			other("default/alpha", func(s *Service) { s.ClusterIPs[0] = a("10.96.0.10") }),
			"10.96.0.10:80/TCP", "default/alpha", func(t *testing.T, st *State) {
				assert.False(t, st.Port(web).ClusterIP.IsValid(), "loser keeps the cluster IP")
				assert.Equal(t, []netip.Addr{a("192.0.2.1"), a("192.0.2.2")}, st.Port(web).NodeIPs, "loser keeps its node port")
			}},
		{"shared external IP: both programmed, the first name holds it",
			other("default/zulu", func(s *Service) { s.ExternalIPs = []netip.Addr{a("10.96.0.10")} }),
			"10.96.0.10:80/TCP", "default/web", func(t *testing.T, st *State) {
				z := st.Port(ServicePortKey{"default/zulu", "http", IPv4})
				assert.Empty(t, z.ExternalIPs)
				assert.Equal(t, a("10.96.0.20"), z.ClusterIP, "the loser keeps its cluster IP")
			}},
		{"same node port", other("default/other", func(s *Service) { s.Ports[0].NodePort = 30080 }),
			"node port 30080/TCP", "default/other", func(t *testing.T, st *State) {
				assert.Empty(t, st.Port(web).NodeIPs)
				assert.Equal(t, a("10.96.0.10"), st.Port(web).ClusterIP)
			}},
		{"an external IP on a node address beats another service's node port there",
			other("default/zzz", func(s *Service) { s.ExternalIPs = []netip.Addr{a("192.0.2.1")}; s.Ports[0].Port = 30080 }),
			"192.0.2.1:30080/TCP", "default/zzz", func(t *testing.T, st *State) {
				assert.Equal(t, []netip.Addr{a("192.0.2.2")}, st.Port(web).NodeIPs)
				assert.Equal(t, []netip.Addr{a("192.0.2.1")}, st.Port(ServicePortKey{"default/zzz", "http", IPv4}).ExternalIPs)
			}},
		{"a node port beats a health check node port", other("default/aaa", func(s *Service) { s.HealthCheckNodePort = 30080 }),
			"node port 30080/TCP", "default/web", func(t *testing.T, st *State) {
				assert.Zero(t, st.Port(ServicePortKey{"default/aaa", "http", IPv4}).HealthCheckNodePort)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var states []*State
			for _, order := range [][]Service{{baseService(), tt.svc}, {tt.svc, baseService()}} {
				st, err := NewState(node, order...)
				require.NoError(t, err)
				states = append(states, st)
			}
			for _, st := range states {
				require.Len(t, st.Conflicts(), 1)
				c := st.Conflicts()[0]
				assert.Equal(t, tt.frontend, c.Frontend)
				assert.Equal(t, tt.winner, c.Winner)
				assert.Equal(t, 2, st.Len())
				tt.check(t, st)
			}
			assert.Equal(t, states[0].Ports(), states[1].Ports(), "the order of arrival decided the winner")
		})
	}
}

// TestConflictIncumbentKeeps: a service that holds a frontend keeps it
// when a later one asks for it, whatever their names; when it gives the
// frontend up, the other gets it in the same change, and Diff reports the
// other as changed. Editing a state keeps its holders.
func TestConflictIncumbentKeeps(t *testing.T) {
	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	require.NoError(t, b.Upsert(baseService()))
	taker := baseService()
	taker.Name = "default/aaa"
	require.NoError(t, b.Upsert(taker))
	s0 := b.State()
	web, aaa := ServicePortKey{"default/web", "http", IPv4}, ServicePortKey{"default/aaa", "http", IPv4}
	require.Equal(t, a("10.96.0.10"), s0.Port(web).ClusterIP, "the incumbent lost its cluster IP to a later service")
	require.False(t, s0.Port(aaa).ClusterIP.IsValid())
	require.Len(t, s0.Conflicts(), 5) // both cluster IPs on both ports, and the node port
	assert.Equal(t, "default/web", s0.Conflicts()[0].Winner)
	assert.ErrorIs(t, s0.Conflicts()[0].Err(), ErrFrontendTaken)

	// An update of the incumbent keeps what it holds.
	web2 := baseService()
	web2.Endpoints[0].Addr = a("10.244.9.9")
	require.NoError(t, b.Upsert(web2))
	require.Equal(t, a("10.96.0.10"), b.State().Port(web).ClusterIP)

	// Edit keeps the holders, although "default/aaa" sorts first.
	require.Equal(t, a("10.96.0.10"), b.State().Edit().State().Port(web).ClusterIP)

	moved := web2
	moved.ClusterIPs = []netip.Addr{a("10.96.0.11")}
	moved.Ports[0].NodePort = 30081
	require.NoError(t, b.Upsert(moved))
	s1 := b.State()
	assert.Equal(t, a("10.96.0.10"), s1.Port(aaa).ClusterIP)
	assert.Empty(t, s1.Conflicts())
	assert.Contains(t, changedKeys(Diff(s0, s1).Changed), aaa.String())
	b.Delete("default/aaa")
	require.NoError(t, b.Upsert(web2))
	assert.Equal(t, a("10.96.0.10"), b.State().Port(web).ClusterIP)
	assert.Empty(t, b.State().Conflicts())
}
