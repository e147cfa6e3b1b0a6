//go:build privileged

package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
	"github.com/kproxy-dev/kproxy/kube"
)

// The example, built and run as an embedder runs it against a real API
// server, programs a node's namespace: a Service and its EndpointSlice
// created in the API become nftables rules for its cluster IP and its
// endpoint, kube-proxy's metrics count the syncs, and SIGTERM ends it.
func TestKubeProxyExample(t *testing.T) {
	testutil.RequireRoot(t)
	host := netnstest.NewHost(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	server, err := testservers.StartKube(ctx)
	if err != nil {
		testutil.SkipOrFail(t, "kube-apiserver: "+err.Error())
	}
	t.Cleanup(server.Stop)
	client, err := kube.NewClient(kube.ClientOptions{Kubeconfig: server.Kubeconfig})
	require.NoError(t, err)

	bin := filepath.Join(t.TempDir(), "kubeproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	metricsAddr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--kubeconfig", server.Kubeconfig, "--hostname-override", "Node-1",
		"--cluster-cidr", "10.244.0.0/16", "--metrics-bind-address", metricsAddr, "--netns", filepath.Join(netnstest.RunDir, host.NSName))
	logs := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	ns := "example"
	_, err = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	svc, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.7"}, NodeName: new("node-1"),
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, err := exec.Command("ip", "netns", "exec", host.NSName, "nft", "list", "table", "inet", "kproxy").CombinedOutput()
		if assert.NoError(c, err, "%s", out) {
			assert.Contains(c, string(out), svc.Spec.ClusterIP)
			assert.Contains(c, string(out), "10.244.1.7")
		}
	}, time.Minute, 200*time.Millisecond, "the service's rules in the node's namespace; logs:\n%s", logs)

	resp, err := http.Get("http://" + metricsAddr)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`)

	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-done:
		done <- err
	case <-time.After(30 * time.Second):
		t.Fatalf("not ended by SIGTERM; logs:\n%s", logs)
	}
}
