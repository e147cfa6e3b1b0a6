package kube_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// A Service and its EndpointSlice, read by a Source into a Runner: the
// Runner's proxier (here the fake; nftables.New on a node) is given the
// service with its endpoint once the Source is synced. A client of a
// real cluster comes from kube.NewClient.
func Example() {
	client := k8sfake.NewClientset(
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
				Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.7"}, Conditions: discoveryv1.EndpointConditions{Ready: new(true)}}},
		},
	)
	proxier := &fake.Proxier{}
	runner, err := servicelb.NewRunner(proxier, servicelb.RunnerOptions{})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := &kube.Source{Client: client}
	dst := runner.Source(src.Name())
	go func() { _ = src.Run(ctx, dst, func(obj string, err error) { fmt.Println("left out:", obj, err) }) }()
	go func() { _ = runner.Run(ctx) }()
	if _, err := proxier.WaitSyncs(ctx, 1); err != nil {
		panic(err)
	}
	svc, _ := proxier.Applied().Service("default/web")
	fmt.Println(svc.Name, svc.ClusterIPs, svc.Ports[0].Port, svc.Endpoints[0].Addr, svc.Endpoints[0].Ports)
	// Output: default/web [10.96.0.10] 80 10.244.1.7 map[http:8080]
}
