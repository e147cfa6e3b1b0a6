package kube

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func ptr[T any](v T) *T { return &v }

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func svc(mut func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if mut != nil {
		mut(s)
	}
	return s
}

func slice(name string, typ discoveryv1.AddressType, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: typ,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints:   eps,
	}
}

var cmpAddrs = cmp.Options{
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

func TestTranslate(t *testing.T) {
	httpPorts := map[string]uint16{"http": 8080}
	for _, tc := range []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   servicelb.Service
	}{{
		name: "cluster IP, conditions",
		svc:  svc(nil),
		slices: []*discoveryv1.EndpointSlice{slice("a", discoveryv1.AddressTypeIPv4,
			discoveryv1.Endpoint{Addresses: []string{"10.1.0.1"}, NodeName: ptr("n1"), Zone: ptr("z1")},
			discoveryv1.Endpoint{Addresses: []string{"10.1.0.2"}, Conditions: discoveryv1.EndpointConditions{
				Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
			discoveryv1.Endpoint{Addresses: []string{"10.1.0.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
			discoveryv1.Endpoint{Addresses: []string{"10.1.0.4"}, Hints: &discoveryv1.EndpointHints{
				ForZones: []discoveryv1.ForZone{{Name: "z1"}}, ForNodes: []discoveryv1.ForNode{{Name: "n1"}}}},
		), slice("fqdn", discoveryv1.AddressTypeFQDN, discoveryv1.Endpoint{Addresses: []string{"example.test"}})},
		want: servicelb.Service{
			Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
			Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{
				{Addr: netip.MustParseAddr("10.1.0.1"), Ports: httpPorts, OnlyNamedPorts: true, NodeName: "n1", Zone: "z1"},
				{Addr: netip.MustParseAddr("10.1.0.2"), Ready: new(false), Ports: httpPorts, OnlyNamedPorts: true, Serving: new(true), Terminating: true},
				// Serving unknown counts as serving, as kube-proxy reads it.
				{Addr: netip.MustParseAddr("10.1.0.3"), Ready: new(false), Ports: httpPorts, OnlyNamedPorts: true, Serving: new(true)},
				{Addr: netip.MustParseAddr("10.1.0.4"), Ports: httpPorts, OnlyNamedPorts: true,
					Hints: servicelb.Hints{ForZones: []string{"z1"}, ForNodes: []string{"n1"}}},
			},
		},
	}, {
		name: "load balancer",
		svc: svc(func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.Ports[0].TargetPort = intstr.FromString("web")
			s.Spec.ExternalIPs = []string{"192.0.2.1"}
			s.Spec.LoadBalancerSourceRanges = []string{" 198.51.100.7/24 "}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			s.Spec.HealthCheckNodePort = 30500
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.5"}, {Hostname: "lb.example"},
				{IP: "203.0.113.6", IPMode: ptr(corev1.LoadBalancerIPModeProxy)}, {IP: "203.0.113.7", IPMode: ptr(corev1.LoadBalancerIPModeVIP)}}
			s.Annotations = map[string]string{AnnotationScheduler: "rr"}
		}),
		want: servicelb.Service{
			Name: "ns/web", ClusterIPs: addrs("10.96.0.10"), ExternalIPs: addrs("192.0.2.1"), LoadBalancerIPs: addrs("203.0.113.5", "203.0.113.7"),
			ProxiedLoadBalancerIPs: addrs("203.0.113.6"),
			Ports:                  []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
			InternalTrafficPolicy:  servicelb.PolicyLocal, ExternalTrafficPolicy: servicelb.PolicyLocal,
			SourceRanges:        []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			HealthCheckNodePort: 30500, Scheduler: "rr",
			Affinity: servicelb.SessionAffinity{ClientIP: true, Timeout: time.Minute},
		},
	}, {
		name: "node port ignored on a ClusterIP service",
		svc:  svc(func(s *corev1.Service) { s.Spec.Ports[0].NodePort = 30080 }),
		want: servicelb.Service{Name: "ns/web", ClusterIPs: addrs("10.96.0.10"),
			Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Translate(tc.svc, tc.slices)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Service, cmpAddrs); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if len(got.Skipped) > 0 {
				t.Errorf("skipped %v", got.Skipped)
			}
		})
	}
}

// TestSlicePortsOnly: an endpoint serves a service port only when its
// slice lists that port, as kube-proxy takes endpoints per slice port: a
// pod without the named container port gets no traffic for it, and its
// other ports do not fall back to the service's port.
func TestSlicePortsOnly(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")},
			{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromString("metrics")},
		}
	})
	metricsOnly := slice("m", discoveryv1.AddressTypeIPv4, discoveryv1.Endpoint{Addresses: []string{"10.1.0.1"}})
	metricsOnly.Ports = []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9100)), Protocol: ptr(corev1.ProtocolTCP)}}
	both := slice("b", discoveryv1.AddressTypeIPv4, discoveryv1.Endpoint{Addresses: []string{"10.1.0.2"}})
	both.Ports = []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Name: ptr("metrics"), Port: ptr(int32(9100))}}
	got, err := Translate(s, []*discoveryv1.EndpointSlice{metricsOnly, both})
	if err != nil {
		t.Fatal(err)
	}
	st, err := servicelb.NewState(servicelb.NodeConfig{}, got.Service)
	if err != nil {
		t.Fatal(err)
	}
	backends := func(port string) []string {
		var out []string
		for _, b := range st.Port(servicelb.ServicePortKey{Service: "ns/web", Port: port, Family: servicelb.IPv4}).Cluster {
			out = append(out, b.String())
		}
		return out
	}
	if diff := cmp.Diff([]string{"10.1.0.2:8080"}, backends("http")); diff != "" {
		t.Errorf("http (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.1.0.1:9100", "10.1.0.2:9100"}, backends("metrics")); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func TestTranslateSkips(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{"headless", svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), "headless"},
		{"external name", svc(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), "ExternalName"},
		{"a cluster IP that is no IP", svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "x", []string{"x"} }), `spec.clusterIPs[0] "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Translate(tc.svc, nil)
			require.ErrorIs(t, err, ErrSkipped)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "service ns/web")
		})
	}
}

// TestTranslateLeavesOutWhatItCannotRead: an address that is no IP, a
// source range that is no CIDR, a slice port without a name or a number
// are left out and named; the rest of the service is translated, as
// kube-proxy proxies it. Leading zeros of IPv4 octets read as kube-proxy
// reads them.
func TestTranslateLeavesOutWhatItCannotRead(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{"1.2.3", "192.0.2.1"}
		s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/33", "198.51.100.0/24"}
	})
	sl := slice("a", discoveryv1.AddressTypeIPv4,
		discoveryv1.Endpoint{Addresses: []string{"10.244.001.003"}},
		discoveryv1.Endpoint{Addresses: []string{"not-an-ip"}},
		discoveryv1.Endpoint{Addresses: []string{"10.244.1.4"}})
	sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Port: ptr(int32(1))}, discoveryv1.EndpointPort{Name: ptr("http")})
	got, err := Translate(s, []*discoveryv1.EndpointSlice{sl})
	require.NoError(t, err)
	assert.Equal(t, addrs("192.0.2.1"), got.Service.ExternalIPs)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, got.Service.SourceRanges)
	var eps []netip.Addr
	for _, e := range got.Service.Endpoints {
		eps = append(eps, e.Addr)
		assert.Equal(t, map[string]uint16{"http": 8080}, e.Ports)
	}
	assert.Equal(t, addrs("10.244.1.3", "10.244.1.4"), eps, "10.244.001.003 is 10.244.1.3, as kube-proxy reads it")
	var skipped []string
	for _, e := range got.Skipped {
		skipped = append(skipped, e.Error())
	}
	assert.Equal(t, []string{
		`spec.externalIPs[0] "1.2.3" is no IP address`,
		`spec.loadBalancerSourceRanges[0] "198.51.100.0/33" is no CIDR`,
		`endpointslice a: ports[1] has no name`,
		`endpointslice a: ports[2] ("http") has no port number`,
		`endpointslice a: endpoints[1].addresses[0] "not-an-ip" is no IP address`,
	}, skipped)
}

// TestSlicePortProtocol: a slice port serves the service port of its
// name and protocol alone, as kube-proxy keys a slice's endpoints by
// both: a TCP port of the name of a UDP service port is no endpoint of
// it.
func TestSlicePortProtocol(t *testing.T) {
	s := svc(func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53}}
	})
	sl := slice("a", discoveryv1.AddressTypeIPv4, discoveryv1.Endpoint{Addresses: []string{"10.244.1.2"}})
	sl.Ports = []discoveryv1.EndpointPort{{Name: ptr("dns"), Port: ptr(int32(5353)), Protocol: ptr(corev1.ProtocolTCP)}}
	got, err := Translate(s, []*discoveryv1.EndpointSlice{sl})
	require.NoError(t, err)
	st, err := servicelb.NewState(servicelb.NodeConfig{}, got.Service)
	require.NoError(t, err)
	assert.Empty(t, st.Port(servicelb.ServicePortKey{Service: "ns/web", Port: "dns", Family: servicelb.IPv4}).Cluster,
		"the UDP port has no endpoint: the slice names a TCP one")
	sl.Ports[0].Protocol = ptr(corev1.ProtocolUDP)
	got, err = Translate(s, []*discoveryv1.EndpointSlice{sl})
	require.NoError(t, err)
	st, err = servicelb.NewState(servicelb.NodeConfig{}, got.Service)
	require.NoError(t, err)
	assert.Len(t, st.Port(servicelb.ServicePortKey{Service: "ns/web", Port: "dns", Family: servicelb.IPv4}).Cluster, 1)
}

// TestSelector: kube-proxy's label selector of Services and
// EndpointSlices.
func TestSelector(t *testing.T) {
	assert.Equal(t, "!"+LabelHeadless+",!"+LabelProxyName, Selector("").String())
	assert.Equal(t, "!"+LabelHeadless+","+LabelProxyName+"=mine", Selector("mine").String())
}
