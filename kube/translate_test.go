package kubesource

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
			if diff := cmp.Diff(tc.want, got, cmpAddrs); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
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
	st, err := servicelb.NewState(servicelb.NodeConfig{}, got)
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

func TestTranslateSkipsAndErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		skip bool
		want string
	}{
		{"headless", svc(func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }), true, "headless"},
		{"external name", svc(func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName }), true, "ExternalName"},
		{"bad external IP", svc(func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"1.2.3"} }), false, "spec.externalIPs[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Translate(tc.svc, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one mentioning %q", err, tc.want)
			}
			if errors.Is(err, ErrSkipped) != tc.skip {
				t.Errorf("errors.Is(err, ErrSkipped) = %v, want %v", !tc.skip, tc.skip)
			}
		})
	}
}

func TestSelector(t *testing.T) {
	if got := Selector("").String(); got != "!"+LabelProxyName {
		t.Errorf("Selector(\"\") = %q", got)
	}
	if got := Selector("mine").String(); got != LabelProxyName+"=mine" {
		t.Errorf("Selector(mine) = %q", got)
	}
}
