package kube

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// FuzzTranslate: any Service and EndpointSlice the API server could hand
// over (decoded from JSON) translate without panic, the same way every
// time (the translation must not follow map order), into a service that
// servicelb validates or refuses with a *ValidationError.
func FuzzTranslate(f *testing.F) {
	s, err := json.Marshal(svc(func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}
	}))
	if err != nil {
		f.Fatal(err)
	}
	sl, err := json.Marshal(slice("web-1", discoveryv1.AddressTypeIPv4,
		discoveryv1.Endpoint{Addresses: []string{"10.244.1.2"}, NodeName: ptr("n1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.244.2.2"}, Zone: ptr("z"), Conditions: discoveryv1.EndpointConditions{Serving: ptr(true), Terminating: ptr(true)}}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(s, sl)
	f.Add([]byte(`{"spec":{"clusterIP":"None"}}`), []byte(`{}`))
	f.Add([]byte(`{"metadata":{"name":"x"},"spec":{"clusterIPs":["10.96.0.1","fd00::1"],"ports":[{"port":53,"protocol":"UDP"}]}}`),
		[]byte(`{"addressType":"IPv6","ports":[{"port":5353}],"endpoints":[{"addresses":["fd00::2"]}]}`))
	node := servicelb.NodeConfig{NodeName: "n1", Zone: "z"}
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON []byte) {
		var s corev1.Service
		var sl discoveryv1.EndpointSlice
		if json.Unmarshal(svcJSON, &s) != nil || json.Unmarshal(sliceJSON, &sl) != nil {
			return
		}
		slices := []*discoveryv1.EndpointSlice{&sl, &sl}
		a, errA := Translate(&s, slices)
		b, errB := Translate(&s, slices)
		if diff := cmp.Diff(a.Service, b.Service, cmpAddrs); diff != "" || fmt.Sprint(errA) != fmt.Sprint(errB) || fmt.Sprint(a.Skipped) != fmt.Sprint(b.Skipped) {
			t.Fatalf("two translations differ: %v / %v\n%s", errA, errB, diff)
		}
		if errA != nil {
			return
		}
		bld, err := servicelb.NewBuilder(node)
		if err != nil {
			t.Fatal(err)
		}
		var ve *servicelb.ValidationError
		if err := bld.Upsert(a.Service); err != nil && !errors.As(err, &ve) {
			t.Fatalf("servicelb refuses the translation without saying where: %v", err)
		}
	})
}
