//go:build privileged

package kubesource

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/e2e"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
	"github.com/kproxy-dev/kproxy/kube"
)

var server *testservers.Kube

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	var err error
	server, err = testservers.StartKube(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-apiserver:", err)
	}
	code := m.Run()
	server.Stop()
	os.Exit(code)
}

func client(t *testing.T) kubernetes.Interface {
	t.Helper()
	if server == nil {
		testutil.SkipOrFail(t, "kube-apiserver did not start (see the error above)")
	}
	cfg, err := kube.RestConfig(kube.ClientOptions{Kubeconfig: server.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAPIServerFake(t *testing.T) {
	c := client(t)
	scenario(t, c, func(src *kube.Source) *e2e.World { return e2e.StartFake(t, src) })
}

func TestAPIServerPackets(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) {
			c := client(t)
			scenario(t, c, func(src *kube.Source) *e2e.World { return e2e.StartPackets(t, backend, src) })
		})
	}
}

// ep is an endpoint of backend i with its conditions.
type ep struct {
	i                           int
	ready, serving, terminating bool
}

func ready(is ...int) []ep {
	var out []ep
	for _, i := range is {
		out = append(out, ep{i: i, ready: true, serving: true})
	}
	return out
}

func endpointSlice(ns, name, svc string, eps []ep) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{sandbox.BackendAddr(e.i).String()},
			NodeName:  new(e2e.NodeName),
			Conditions: discoveryv1.EndpointConditions{
				Ready: new(e.ready), Serving: new(e.serving), Terminating: new(e.terminating)},
		})
	}
	return sl
}

func service(ns, name string, mut func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:  corev1.ServiceTypeNodePort,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if mut != nil {
		mut(s)
	}
	return s
}

// fixture is a test namespace on the API server.
type fixture struct {
	t      *testing.T
	ns     string
	svcs   typedcorev1.ServiceInterface
	slices typeddiscoveryv1.EndpointSliceInterface
}

func newFixture(t *testing.T, c kubernetes.Interface) *fixture {
	ctx := context.Background()
	var tag [3]byte
	_, _ = rand.Read(tag[:])
	ns := "t-" + hex.EncodeToString(tag[:])
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ns: ns, svcs: c.CoreV1().Services(ns), slices: c.DiscoveryV1().EndpointSlices(ns)}
	t.Cleanup(func() {
		for _, n := range []string{"web", "bad", "headless", "other", "local", "lb"} {
			_ = f.svcs.Delete(ctx, n, metav1.DeleteOptions{})
		}
		_ = f.slices.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	return f
}

// slice creates or replaces web's endpoint slice.
func (f *fixture) slice(eps []ep) {
	f.t.Helper()
	ctx := context.Background()
	sl := endpointSlice(f.ns, "web-a", "web", eps)
	old, err := f.slices.Get(ctx, sl.Name, metav1.GetOptions{})
	if err == nil {
		sl.ResourceVersion = old.ResourceVersion
		_, err = f.slices.Update(ctx, sl, metav1.UpdateOptions{})
	} else {
		_, err = f.slices.Create(ctx, sl, metav1.CreateOptions{})
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

// label sets a label of a slice, or removes it when value is "-".
func (f *fixture) label(slice, key, value string) {
	f.t.Helper()
	ctx := context.Background()
	sl, err := f.slices.Get(ctx, slice, metav1.GetOptions{})
	require.NoError(f.t, err)
	if value == "-" {
		delete(sl.Labels, key)
	} else {
		sl.Labels[key] = value
	}
	_, err = f.slices.Update(ctx, sl, metav1.UpdateOptions{})
	require.NoError(f.t, err)
}

func (f *fixture) create(s *corev1.Service) *corev1.Service {
	f.t.Helper()
	out, err := f.svcs.Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

// scenario creates services and endpoint slices through the API and checks
// that the agent follows each change within 2 s, skips what it must, and
// reports a bad service without disturbing the others.
func scenario(t *testing.T, c kubernetes.Interface, start func(*kube.Source) *e2e.World) {
	ctx := context.Background()
	f := newFixture(t, c)
	ns := f.ns
	web := f.create(service(ns, "web", nil))
	f.slice(ready(1, 2, 3))

	w := start(&kube.Source{Client: c})
	key := ns + "/web"
	vip := e2e.Target{Service: key, URL: fmt.Sprintf("http://%s:80/", web.Spec.ClusterIP)}
	nodePort := e2e.Target{Service: key, URL: fmt.Sprintf("http://%s:%d/", sandbox.NodeAddr, web.Spec.Ports[0].NodePort)}
	w.Expect(t, 20*time.Second, vip, 1, 2, 3)
	w.Expect(t, 2*time.Second, nodePort, 1, 2, 3)

	t.Log("backend 3 not ready")
	f.slice(append(ready(1, 2), ep{i: 3}))
	w.Expect(t, 2*time.Second, vip, 1, 2)

	t.Log("backend 2 terminating but serving: only the ready backend 1 takes traffic")
	f.slice([]ep{{i: 1, ready: true, serving: true}, {i: 2, serving: true, terminating: true}, {i: 3}})
	w.Expect(t, 2*time.Second, vip, 1)

	t.Log("no backend ready: the serving, terminating ones take it")
	f.slice([]ep{{i: 1, serving: true, terminating: true}, {i: 2, serving: true, terminating: true}, {i: 3, terminating: true}})
	w.Expect(t, 2*time.Second, vip, 1, 2)

	t.Log("a clashing service: an external IP that is web's cluster IP, on the same port, is not served; the rest of the service is")
	f.slice(ready(2, 3))
	f.create(service(ns, "bad", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.ExternalIPs = []string{web.Spec.ClusterIP}
	}))
	w.WaitReport(t, 2*time.Second, ns+"/bad", "already used by another service")
	w.Expect(t, 2*time.Second, vip, 2, 3)

	t.Log("a headless service and another proxy's service are ignored")
	f.create(service(ns, "headless", func(s *corev1.Service) {
		s.Spec.Type, s.Spec.ClusterIP = corev1.ServiceTypeClusterIP, corev1.ClusterIPNone
	}))
	f.create(service(ns, "other", func(s *corev1.Service) { s.Labels = map[string]string{kube.LabelProxyName: "someone-else"} }))

	checkLocal(t, f, w)

	t.Log("web's slice labelled service.kubernetes.io/headless is read no more: web has no endpoints; unlabelled, it has them again")
	f.label("web-a", kube.LabelHeadless, "")
	w.Expect(t, 2*time.Second, vip)
	f.label("web-a", kube.LabelHeadless, "-")
	w.Expect(t, 2*time.Second, vip, 2, 3)

	t.Log("endpoint slice deleted: no backends")
	if err := f.slices.Delete(ctx, "web-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Expect(t, 2*time.Second, vip)
	if _, ok := w.Agent.Runner().State().Service(ns + "/bad"); !ok {
		t.Error("the clashing service is not in the desired state: only its clashing frontend should be left out")
	}
	for _, n := range []string{"headless", "other"} {
		if _, ok := w.Agent.Runner().State().Service(ns + "/" + n); ok {
			t.Errorf("service %s is in the desired state, want it skipped", n)
		}
	}
	if len(w.Reports.Of(ns+"/headless"))+len(w.Reports.Of(ns+"/other")) > 0 {
		t.Errorf("skipped services were reported as invalid")
	}

	t.Log("slice back with backend 1, then the service deleted")
	f.slice(ready(1))
	w.Expect(t, 2*time.Second, vip, 1)
	if err := f.svcs.Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Expect(t, 2*time.Second, vip)
	if _, ok := w.Agent.Runner().State().Service(key); ok {
		t.Error("deleted service still in the desired state")
	}
}

// checkLocal creates a service with the Local internal traffic policy
// whose endpoints run on this node (backend 1) and another (backend 2):
// only the local one takes its traffic.
func checkLocal(t *testing.T, f *fixture, w *e2e.World) {
	t.Helper()
	t.Log("internal traffic policy Local: only the endpoint on this node")
	local := f.create(service(f.ns, "local", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeClusterIP
		s.Spec.InternalTrafficPolicy = new(corev1.ServiceInternalTrafficPolicyLocal)
	}))
	sl := endpointSlice(f.ns, "local-a", "local", ready(1, 2))
	sl.Endpoints[1].NodeName = new("node-2")
	if _, err := f.slices.Create(context.Background(), sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tg := e2e.Target{Service: f.ns + "/local", URL: fmt.Sprintf("http://%s:80/", local.Spec.ClusterIP)}
	w.Expect(t, 2*time.Second, tg, 1)
}

// TestAPIServerHealthCheck runs two agents as two nodes against the API
// server: a LoadBalancer service of the external Local policy has its
// health check node port answer 200 on the node with its endpoint and 503
// on the other, its node port forwards on the first and drops on the
// other, and both flip when the endpoint moves. Both nodes' proxies are
// healthy.
func TestAPIServerHealthCheck(t *testing.T) {
	c := client(t)
	f := newFixture(t, c)
	lb := f.create(service(f.ns, "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}))
	hc := uint16(lb.Spec.HealthCheckNodePort)
	if hc == 0 {
		t.Fatal("the API server allocated no health check node port")
	}
	slice := func(node string) {
		t.Helper()
		sl := endpointSlice(f.ns, "lb-a", "lb", ready(1))
		sl.Endpoints[0].NodeName = new(node)
		ctx := context.Background()
		if old, err := f.slices.Get(ctx, sl.Name, metav1.GetOptions{}); err == nil {
			sl.ResourceVersion = old.ResourceVersion
			_, err = f.slices.Update(ctx, sl, metav1.UpdateOptions{})
			require.NoError(t, err)
			return
		}
		_, err := f.slices.Create(ctx, sl, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	slice(e2e.NodeName)

	node1 := e2e.StartPackets(t, "nftables", &kube.Source{Client: c})
	node2 := e2e.StartPackets(t, "nftables", &kube.Source{Client: c}, func(cfg *agent.Config) { cfg.NodeName = "node-2" })
	nodePort := e2e.Target{Service: f.ns + "/lb", URL: fmt.Sprintf("http://%s:%d/", sandbox.NodeAddr, lb.Spec.Ports[0].NodePort)}
	local := func(w *e2e.World, code, endpoints int) {
		t.Helper()
		a := w.ExpectHealth(t, 20*time.Second, hc, "/", code)
		var body struct {
			Service             struct{ Namespace, Name string }
			LocalEndpoints      int
			ServiceProxyHealthy bool
		}
		require.NoError(t, json.Unmarshal([]byte(a.Body), &body), a.Body)
		assert.Equal(t, f.ns, body.Service.Namespace)
		assert.Equal(t, "lb", body.Service.Name)
		assert.Equal(t, endpoints, body.LocalEndpoints)
		assert.True(t, body.ServiceProxyHealthy)
	}

	t.Log("the endpoint on node-1")
	local(node1, http.StatusOK, 1)
	local(node2, http.StatusServiceUnavailable, 0)
	node1.Expect(t, 2*time.Second, nodePort, 1)
	node2.Expect(t, 2*time.Second, nodePort)
	for _, w := range []*e2e.World{node1, node2} {
		w.ExpectHealth(t, 2*time.Second, e2e.HealthzPort, "/healthz", http.StatusOK)
		w.ExpectHealth(t, 2*time.Second, e2e.HealthzPort, "/livez", http.StatusOK)
	}

	t.Log("the endpoint moves to node-2")
	slice("node-2")
	local(node1, http.StatusServiceUnavailable, 0)
	local(node2, http.StatusOK, 1)
	node2.Expect(t, 2*time.Second, nodePort, 1)
	node1.Expect(t, 2*time.Second, nodePort)

	t.Log("the service deleted: its health check node port closes")
	require.NoError(t, f.svcs.Delete(context.Background(), "lb", metav1.DeleteOptions{}))
	for _, w := range []*e2e.World{node1, node2} {
		require.Eventually(t, func() bool {
			_, err := w.Health(context.Background(), hc, "/")
			return err != nil
		}, 2*time.Second, 20*time.Millisecond)
	}
}

// TestAPIServerNodeEligible runs an agent as node of a Node object of the
// API server: its /healthz answers 503 with nodeEligible false while the
// Node is missing, tainted ToBeDeletedByClusterAutoscaler or being
// deleted, and 200 otherwise; /livez answers 200 throughout.
func TestAPIServerNodeEligible(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	var tag [3]byte
	_, _ = rand.Read(tag[:])
	name := "eligible-" + hex.EncodeToString(tag[:])
	nodes := c.CoreV1().Nodes()
	const finalizer = "kproxy.dev/test"
	t.Cleanup(func() {
		if n, err := nodes.Get(ctx, name, metav1.GetOptions{}); err == nil {
			n.Finalizers = nil
			_, _ = nodes.Update(ctx, n, metav1.UpdateOptions{})
		}
		_ = nodes.Delete(ctx, name, metav1.DeleteOptions{})
	})
	w := e2e.StartPackets(t, "nftables", &kube.Source{Client: c, NodeName: name, NodeWait: time.Second}, func(cfg *agent.Config) { cfg.NodeName = name })
	type health struct {
		NodeEligible *bool `json:"nodeEligible"`
		Healthy      bool  `json:"healthy"`
	}
	// expect waits for /healthz to answer code, the proxy itself healthy
	// (its first sync done) and the node eligible or not.
	expect := func(what string, code int, eligible bool) {
		t.Helper()
		t.Log(what)
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			a, err := w.Health(ctx, e2e.HealthzPort, "/healthz")
			if !assert.NoError(c, err) {
				return
			}
			var h health
			if !assert.NoError(c, json.Unmarshal([]byte(a.Body), &h), a.Body) || !assert.NotNil(c, h.NodeEligible, a.Body) {
				return
			}
			assert.Equal(c, code, a.Code, a.Body)
			assert.Equal(c, eligible, *h.NodeEligible, a.Body)
			assert.True(c, h.Healthy, "the proxy itself healthy: %s", a.Body)
		}, 20*time.Second, 50*time.Millisecond, what)
		w.ExpectHealth(t, 2*time.Second, e2e.HealthzPort, "/livez", http.StatusOK)
	}
	update := func(edit func(n *corev1.Node)) {
		t.Helper()
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		edit(n)
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	expect("no Node of this name", http.StatusServiceUnavailable, false)
	_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: []string{finalizer}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	expect("the Node created", http.StatusOK, true)
	update(func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: kube.ToBeDeletedTaint, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule})
	})
	expect("the Node tainted ToBeDeletedByClusterAutoscaler", http.StatusServiceUnavailable, false)
	update(func(n *corev1.Node) { n.Spec.Taints = nil })
	expect("the taint removed", http.StatusOK, true)
	require.NoError(t, nodes.Delete(ctx, name, metav1.DeleteOptions{}))
	expect("the Node being deleted (its finalizer holds it)", http.StatusServiceUnavailable, false)
	update(func(n *corev1.Node) { n.Finalizers = nil })
	require.Eventually(t, func() bool {
		_, err := nodes.Get(ctx, name, metav1.GetOptions{})
		return err != nil
	}, 20*time.Second, 50*time.Millisecond)
	expect("the Node gone", http.StatusServiceUnavailable, false)
}
