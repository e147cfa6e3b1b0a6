//go:build privileged

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/kproxy-dev/kproxy/examples/internal/kubesource"
	"github.com/kproxy-dev/kproxy/examples/internal/testservers"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
)

func ptr[T any](v T) *T { return &v }

// The binary, run with a kubeconfig against a real API server, prints the
// rules for the services it finds.
func TestDryRunAgainstAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	kube, err := testservers.StartKube(ctx)
	if err != nil {
		testutil.SkipOrFail(t, "kube-apiserver: "+err.Error())
	}
	defer kube.Stop()
	cfg, err := kubesource.RestConfig(kube.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(cfg)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.7.7", Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.100.1.2"}}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := program().Run(ctx, []string{"--kubeconfig", kube.Kubeconfig, "--backend", "iptables", "--dry-run", "--once"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"-d 10.96.7.7/32", `"default/web:http -> 10.100.1.2:8080"`, "--to-destination 10.100.1.2:8080"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// Under --detect-local-mode=NodeCIDR the agent reads its Node's pod
	// CIDRs: traffic to the cluster IP from outside them is masqueraded.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec: corev1.NodeSpec{PodCIDR: "10.100.1.0/24", PodCIDRs: []string{"10.100.1.0/24"}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code = program().Run(ctx, []string{"--kubeconfig", kube.Kubeconfig, "--backend", "iptables", "--dry-run", "--once",
		"--node-name", "n1", "--detect-local-mode", "NodeCIDR"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("NodeCIDR: exit %d: %s", code, errOut.String())
	}
	if want := "! -s 10.100.1.0/24 -d 10.96.7.7/32"; !strings.Contains(out.String(), want) {
		t.Errorf("NodeCIDR: output lacks %q:\n%s", want, out.String())
	}
}
