//go:build privileged

package consulsource

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/examples/internal/e2e"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/testservers"
)

var consul *testservers.ConsulAgent

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	var err error
	consul, err = testservers.StartConsul(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "consul:", err)
	}
	code := m.Run()
	consul.Stop()
	os.Exit(code)
}

func client(t *testing.T) *api.Client {
	t.Helper()
	if consul == nil {
		testutil.SkipOrFail(t, "the consul agent did not start (see the error above)")
	}
	c, err := api.NewClient(&api.Config{Address: consul.Addr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestConsulFake(t *testing.T) {
	c := client(t)
	scenario(t, c, func(src *Source) *e2e.World { return e2e.StartFake(t, src) })
}

func TestConsulPackets(t *testing.T) {
	for _, backend := range []string{"nftables", "iptables"} {
		t.Run(backend, func(t *testing.T) {
			c := client(t)
			scenario(t, c, func(src *Source) *e2e.World { return e2e.StartPackets(t, backend, src) })
		})
	}
}

// register registers instance id of service name on backend i, with a TTL
// check in the given state.
func register(t *testing.T, c *api.Client, name, id string, i int, meta map[string]string, status string) {
	t.Helper()
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: id, Name: name, Address: sandbox.BackendAddr(i).String(), Port: 8080, Meta: meta,
		Check: &api.AgentServiceCheck{CheckID: "check-" + id, TTL: "10m", Status: status},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Agent().ServiceDeregister(id) })
}

func setCheck(t *testing.T, c *api.Client, id, status string) {
	t.Helper()
	if err := c.Agent().UpdateTTL("check-"+id, "", status); err != nil {
		t.Fatal(err)
	}
}

func deregister(t *testing.T, c *api.Client, id string) {
	t.Helper()
	if err := c.Agent().ServiceDeregister(id); err != nil {
		t.Fatal(err)
	}
}

// scenario registers services and changes their health through Consul's
// API and checks that the agent follows each change within 2 s, and
// reports a bad service without disturbing the others.
func scenario(t *testing.T, c *api.Client, start func(*Source) *e2e.World) {
	meta := map[string]string{MetaVIP: "10.96.0.20", MetaPort: "80", MetaNodePort: "30090"}
	for i := 1; i <= 3; i++ {
		register(t, c, "web", fmt.Sprintf("web-%d", i), i, meta, api.HealthPassing)
	}
	register(t, c, "api", "api-1", 2, nil, api.HealthPassing)
	register(t, c, "plain", "plain-1", 1, nil, api.HealthPassing)

	w := start(&Source{Client: c, Options: Options{Mapping: map[string]Mapping{"api": {VIP: "10.96.0.21", Port: 80}}}})
	web := e2e.Target{Service: "consul/web", URL: "http://10.96.0.20:80/"}
	w.Expect(t, 20*time.Second, web, 1, 2, 3)
	w.Expect(t, 2*time.Second, e2e.Target{Service: "consul/web", URL: fmt.Sprintf("http://%s:30090/", sandbox.NodeAddr)}, 1, 2, 3)
	w.Expect(t, 2*time.Second, e2e.Target{Service: "consul/api", URL: "http://10.96.0.21:80/"}, 2)

	t.Log("web-3 critical, then web-2 warning (not ready by default)")
	setCheck(t, c, "web-3", api.HealthCritical)
	w.Expect(t, 2*time.Second, web, 1, 2)
	setCheck(t, c, "web-2", api.HealthWarning)
	w.Expect(t, 2*time.Second, web, 1)

	t.Log("web-3 passing again, web-1 deregistered")
	setCheck(t, c, "web-3", api.HealthPassing)
	w.Expect(t, 2*time.Second, web, 1, 3)
	deregister(t, c, "web-1")
	w.Expect(t, 2*time.Second, web, 3)

	t.Log("bad services: one takes web's VIP, one has a VIP that is no address")
	register(t, c, "thief", "thief-1", 1, map[string]string{MetaVIP: "10.96.0.20", MetaPort: "80"}, api.HealthPassing)
	register(t, c, "typo", "typo-1", 1, map[string]string{MetaVIP: "10.96.0.x"}, api.HealthPassing)
	w.WaitReport(t, 2*time.Second, "consul/thief", "already used by another service")
	w.WaitReport(t, 2*time.Second, "consul/typo", `vip "10.96.0.x"`)
	w.Expect(t, 2*time.Second, web, 3)
	if _, ok := w.Agent.Runner().State().Service("consul/plain"); ok {
		t.Error("a service without VIP is in the desired state")
	}
	if r := w.Reports.Of("consul/plain"); len(r) > 0 {
		t.Errorf("a service without VIP was reported: %q", r)
	}

	t.Log("every web instance deregistered: the service is gone, and the one that asked for its address gets it")
	deregister(t, c, "web-2")
	deregister(t, c, "web-3")
	w.Expect(t, 2*time.Second, e2e.Target{Service: "consul/thief", URL: "http://10.96.0.20:80/"}, 1)
	if _, ok := w.Agent.Runner().State().Service("consul/web"); ok {
		t.Error("consul/web still in the desired state")
	}
	w.Expect(t, 2*time.Second, e2e.Target{Service: "consul/api", URL: "http://10.96.0.21:80/"}, 2)
}
