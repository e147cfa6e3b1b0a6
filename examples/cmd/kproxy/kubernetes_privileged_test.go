//go:build privileged

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	kubelayer "github.com/kproxy-dev/kproxy/kube"
)

func ptr[T any](v T) *T { return &v }

// adminClient returns a client of the shared API server with its admin
// token.
func adminClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg, err := kubelayer.RestConfig(kubelayer.ClientOptions{Kubeconfig: apiServer(t).Kubeconfig})
	require.NoError(t, err)
	c, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return c
}

// createWeb creates the Service ns/web on cluster IP ip (port 80 to
// 8080) with one ready endpoint, 10.100.1.2.
func createWeb(t *testing.T, c kubernetes.Interface, ns, ip string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ns != "default" {
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	_, err := c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.100.1.2"}}},
	}
	_, err = c.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
	require.NoError(t, err)
}

// kproxy, run with a kubeconfig against a real API server, prints the
// rules for the services it finds; under --detect-local-mode=NodeCIDR it
// reads its Node's pod CIDRs.
func TestDryRunAgainstAPIServer(t *testing.T) {
	c := adminClient(t)
	kubeconfig := apiServer(t).Kubeconfig
	createWeb(t, c, "dryrun", "10.96.7.7")
	code, out, logs := run(t, "--kubeconfig", kubeconfig, "--backend", "iptables", "--dry-run", "--once")
	require.Equal(t, 0, code, logs)
	for _, want := range []string{"-d 10.96.7.7/32", `"dryrun/web:http -> 10.100.1.2:8080"`, "--to-destination 10.100.1.2:8080"} {
		has(t, out, want, "")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec: corev1.NodeSpec{PodCIDR: "10.100.1.0/24", PodCIDRs: []string{"10.100.1.0/24"}}}
	_, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	require.NoError(t, err)
	code, out, logs = run(t, "--kubeconfig", kubeconfig, "--backend", "iptables", "--dry-run", "--once",
		"--node-name", "n1", "--detect-local-mode", "NodeCIDR")
	require.Equal(t, 0, code, logs)
	has(t, out, "! -s 10.100.1.0/24 -d 10.96.7.7/32", "NodeCIDR")
}

// kubeadm's kube-proxy, as its DaemonSet runs it, with kproxy in its
// place: the ConfigMap's file as kubeadm writes it (no mode: iptables;
// its kubeconfig pointed at this API server) and the DaemonSet's command
// line, --config and --hostname-override, in a node's namespace (--netns
// stands for the pod's host network). The service is served to a client,
// through the iptables backend, and the file's conntrack defaults are the
// namespace's. The file sets conntrack.maxPerCore 0, as a cluster whose
// nodes are network namespaces (kind's) sets it: only the initial
// namespace may size the table, and kube-proxy, as kproxy, stops when it
// cannot.
func TestKubeadmDaemonSet(t *testing.T) {
	sb := newSandbox(t)
	c := adminClient(t)
	createWeb(t, c, "kubeadm", "10.96.9.9")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sl, err := c.DiscoveryV1().EndpointSlices("kubeadm").Get(ctx, "web-1", metav1.GetOptions{})
	require.NoError(t, err)
	sl.Endpoints[0].Addresses = []string{sb.Backends[0].Addr.String()}
	_, err = c.DiscoveryV1().EndpointSlices("kubeadm").Update(ctx, sl, metav1.UpdateOptions{})
	require.NoError(t, err)

	_, err = c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	file, err := os.ReadFile(filepath.Join("..", "..", "..", "kube", "kubeproxyconfig", "testdata", "kubeadm.yaml"))
	require.NoError(t, err)
	config := filepath.Join(t.TempDir(), "config.conf")
	file = bytes.Replace(file, []byte("/var/lib/kube-proxy/kubeconfig.conf"), []byte(apiServer(t).Kubeconfig), 1)
	file = bytes.Replace(file, []byte("maxPerCore: null"), []byte("maxPerCore: 0"), 1)
	require.NoError(t, os.WriteFile(config, file, 0o644))
	code, _, logs := run(t, "--config="+config, "--hostname-override=Node-1", "--netns", sb.Node.NSName, "--once")
	require.Equal(t, 0, code, logs)
	assert.Contains(t, logs, "backend=iptables")
	assert.Contains(t, logs, "node=node-1")

	got, err := sb.Get(ctx, "http://10.96.9.9/")
	if err != nil {
		rules, _ := in(t, sb, "iptables-nft-save")
		t.Fatalf("%v\n%s\n%s", err, logs, rules)
	}
	assert.Equal(t, sb.Backends[0].Name, got)
	timeout, ok := in(t, sb, "sysctl", "-n", "net.netfilter.nf_conntrack_tcp_timeout_established")
	require.True(t, ok, timeout)
	assert.Equal(t, "86400", strings.TrimSpace(timeout), "kube-proxy's default, 24h, in the node's namespace")
}
