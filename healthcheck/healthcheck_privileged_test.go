//go:build privileged

package healthcheck_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/healthcheck"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// client makes HTTP requests from a host's namespace, one connection each.
func client(h *netnstest.Host) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := h.Do(func() error {
			var err error
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}

// answer is one HTTP answer, or the error of a request that got none.
type answer struct {
	code   int
	body   string
	header http.Header
	err    error
}

func get(c *http.Client, addr netip.Addr, port uint16, path string) answer {
	url := "http://" + netip.AddrPortFrom(addr, port).String() + path
	resp, err := c.Get(url)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: string(b), header: resp.Header, err: err}
}

// status is a health check node port's body.
type status struct {
	Service struct {
		Namespace, Name string
	}
	LocalEndpoints      int
	ServiceProxyHealthy bool
}

// eventually waits for every address of the node to answer on port as
// check says, and returns the last answers.
func eventually(t *testing.T, c *http.Client, addrs []netip.Addr, port uint16, path string, check func(answer) bool) []answer {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var got []answer
		ok := true
		for _, a := range addrs {
			ans := get(c, a, port, path)
			got = append(got, ans)
			ok = ok && check(ans)
		}
		if ok {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d%s: answers %+v", port, path, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func refused(a answer) bool { return errors.Is(a.err, syscall.ECONNREFUSED) }

func code(want int) func(answer) bool {
	return func(a answer) bool { return a.err == nil && a.code == want }
}

const node = "node"

func lbService(name string, hcPort uint16, eps ...servicelb.Endpoint) servicelb.Service {
	return servicelb.Service{
		Name:                  name,
		ClusterIPs:            []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		LoadBalancerIPs:       []netip.Addr{netip.MustParseAddr("203.0.113.10")},
		Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: servicelb.PolicyLocal,
		HealthCheckNodePort:   hcPort,
		Endpoints:             eps,
	}
}

func endpoint(i int, nodeName string) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: netnstest.BackendIPv4(i), NodeName: nodeName}
}

// TestServicesFollowTheRunner: hooked to a Runner, the health check node
// ports answer from the node's addresses, 200 or 503 as the local endpoint
// comes and goes, and open and close as services and their ports change.
func TestServicesFollowTheRunner(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	c := client(tp.Client)
	nodeIPs := tp.NodeIPs()

	p := &fake.Proxier{}
	var hc *healthcheck.Services
	syncErrs := make(chan error, 100)
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{
		Node:            servicelb.NodeConfig{NodeName: node, NodeIPs: nodeIPs},
		MinSyncInterval: 10 * time.Millisecond,
		Hooks:           servicelb.Hooks{Applied: func(st *servicelb.State) { syncErrs <- hc.Sync(st) }},
	})
	require.NoError(t, err)
	proxy, err := healthcheck.NewProxy(healthcheck.ProxyOptions{Health: r.Health})
	require.NoError(t, err)
	hc = healthcheck.NewServices(healthcheck.ServicesOptions{NetNS: tp.Node.NS, ProxyHealthy: proxy.Live})
	t.Cleanup(func() { assert.NoError(t, hc.Close()) })
	src := r.Source("test")
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	go func() { stopped <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })

	require.NoError(t, src.Upsert(lbService("default/web", 32000, endpoint(0, node))))
	src.Synced()
	got := eventually(t, c, nodeIPs, 32000, "/", code(200))
	for _, a := range got {
		assert.Equal(t, "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}", a.body)
		assert.Equal(t, "application/json", a.header.Get("Content-Type"))
		assert.Equal(t, "nosniff", a.header.Get("X-Content-Type-Options"))
		assert.Equal(t, "1", a.header.Get("X-Load-Balancing-Endpoint-Weight"))
	}
	eventually(t, c, nodeIPs, 32000, "/healthz", code(200))

	t.Log("the endpoint moves to another node")
	require.NoError(t, src.Upsert(lbService("default/web", 32000, endpoint(0, "other"))))
	for _, a := range eventually(t, c, nodeIPs, 32000, "/", code(503)) {
		var s status
		require.NoError(t, json.Unmarshal([]byte(a.body), &s))
		assert.Equal(t, 0, s.LocalEndpoints)
		assert.True(t, s.ServiceProxyHealthy)
		assert.Equal(t, "0", a.header.Get("X-Load-Balancing-Endpoint-Weight"))
	}

	t.Log("back on this node, terminating: still no ready endpoint here")
	term := endpoint(0, node)
	term.Ready, term.Serving, term.Terminating = new(false), new(true), true
	require.NoError(t, src.Upsert(lbService("default/web", 32000, term, endpoint(0, "other"))))
	require.NoError(t, <-syncErrs)
	waitApplied(t, p, "default/web", term)
	eventually(t, c, nodeIPs, 32000, "/", code(503))

	t.Log("ready again")
	require.NoError(t, src.Upsert(lbService("default/web", 32000, endpoint(0, node))))
	eventually(t, c, nodeIPs, 32000, "/", code(200))

	t.Log("the port changes: the old one closes, the new one opens")
	require.NoError(t, src.Upsert(lbService("default/web", 32001, endpoint(0, node))))
	eventually(t, c, nodeIPs, 32001, "/", code(200))
	eventually(t, c, nodeIPs, 32000, "/", refused)

	t.Log("the service goes")
	require.NoError(t, src.Delete("default/web"))
	eventually(t, c, nodeIPs, 32001, "/", refused)
	assert.Empty(t, hc.Ports())
	for len(syncErrs) > 0 {
		assert.NoError(t, <-syncErrs)
	}
}

// waitApplied waits for the fake proxier to have applied the service with
// the endpoint first.
func waitApplied(t *testing.T, p *fake.Proxier, name string, ep servicelb.Endpoint) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := p.Applied()
		if st == nil {
			return false
		}
		svc, ok := st.Service(name)
		return ok && len(svc.Endpoints) > 0 && svc.Endpoints[0].IsReady() == ep.IsReady() && svc.Endpoints[0].NodeName == ep.NodeName
	}, 5*time.Second, 10*time.Millisecond)
}

func state(t *testing.T, nodeIPs []netip.Addr, svcs ...servicelb.Service) *servicelb.State {
	t.Helper()
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: node, NodeIPs: nodeIPs}, svcs...)
	require.NoError(t, err)
	return st
}

// two returns two Local services on ports a and b.
func two(a, b uint16) []servicelb.Service {
	x := lbService("default/blocked", a, endpoint(0, node))
	y := lbService("default/free", b, endpoint(0, node))
	y.ClusterIPs, y.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}, []netip.Addr{netip.MustParseAddr("203.0.113.11")}
	y.Ports[0].NodePort = 30081
	return []servicelb.Service{x, y}
}

// TestServicesPortTaken: a port another program holds is an error naming
// the service, the other services are served, and the next Sync opens it
// once it is free.
func TestServicesPortTaken(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	c := client(tp.Client)
	var squatter net.Listener
	require.NoError(t, tp.Node.Do(func() error {
		var err error
		squatter, err = net.Listen("tcp", ":32010")
		return err
	}))
	hc := healthcheck.NewServices(healthcheck.ServicesOptions{NetNS: tp.Node.NS})
	defer hc.Close()
	st := state(t, tp.NodeIPs(), two(32010, 32011)...)

	err := hc.Sync(st)
	var le *healthcheck.ListenError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "default/blocked", le.Service)
	assert.Equal(t, uint16(32010), le.Port)
	assert.ErrorIs(t, err, syscall.EADDRINUSE)
	assert.Contains(t, err.Error(), `service "default/blocked": health check node port 32010`)
	eventually(t, c, tp.NodeIPs(), 32011, "/", code(200))
	assert.Equal(t, map[string]uint16{"default/free": 32011}, hc.Ports())

	require.NoError(t, squatter.Close())
	require.NoError(t, hc.Sync(st), "the same state again: the port is tried again")
	for _, a := range eventually(t, c, tp.NodeIPs(), 32010, "/", code(200)) {
		assert.Contains(t, a.body, `"name": "blocked"`)
	}
}

// TestServicesAddrs: with addresses given, the ports are served there
// alone; a port moves from one service to another in one state.
func TestServicesAddrs(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	c := client(tp.Client)
	hc := healthcheck.NewServices(healthcheck.ServicesOptions{NetNS: tp.Node.NS, Addrs: []netip.Addr{tp.Node.IPv6}})
	defer hc.Close()
	require.NoError(t, hc.Sync(state(t, tp.NodeIPs(), two(32020, 32021)...)))
	eventually(t, c, []netip.Addr{tp.Node.IPv6}, 32020, "/", code(200))
	eventually(t, c, []netip.Addr{tp.Node.IPv4}, 32020, "/", refused)

	require.NoError(t, hc.Sync(state(t, tp.NodeIPs(), two(32021, 32022)...)), "blocked takes free's port as free moves")
	a := eventually(t, c, []netip.Addr{tp.Node.IPv6}, 32021, "/", code(200))
	assert.Contains(t, a[0].body, `"name": "blocked"`)
	a = eventually(t, c, []netip.Addr{tp.Node.IPv6}, 32022, "/", code(200))
	assert.Contains(t, a[0].body, `"name": "free"`)
	eventually(t, c, []netip.Addr{tp.Node.IPv6}, 32020, "/", refused)
}

// goroutines counts the goroutines of this process whose stack holds one
// of the functions.
func goroutines(funcs ...string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, f := range funcs {
			if strings.Contains(g, f) {
				n++
				break
			}
		}
	}
	return n
}

const (
	listening = "net/http.(*Server).Serve("
	serving   = "net/http.(*conn).serve("
)

// serverGoroutines counts the goroutines that serve HTTP in this process.
func serverGoroutines() int { return goroutines(listening, serving) }

// TestServicesCloseLeavesNothing: Close closes every listener and
// connection, idle keep-alive ones included, and no goroutine is left
// serving; a Sync after it fails.
func TestServicesCloseLeavesNothing(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	before := serverGoroutines()
	hc := healthcheck.NewServices(healthcheck.ServicesOptions{NetNS: tp.Node.NS})
	st := state(t, tp.NodeIPs(), two(32030, 32031)...)
	require.NoError(t, hc.Sync(st))
	c := client(tp.Client)
	eventually(t, c, tp.NodeIPs(), 32030, "/", code(200))

	var conn net.Conn
	require.NoError(t, tp.Client.Do(func() error {
		var err error
		conn, err = net.Dial("tcp", netip.AddrPortFrom(tp.Node.IPv4, 32031).String())
		return err
	}))
	defer conn.Close()
	_, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(buf[:n]), "HTTP/1.1 200 OK"), string(buf[:n]))
	assert.Greater(t, serverGoroutines(), before, "serving: two ports on every address, and a kept-alive connection")

	require.NoError(t, hc.Close())
	assert.Zero(t, goroutines(listening), "Close waits for the listeners' goroutines")
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(2*time.Second)))
	_, err = conn.Read(buf)
	assert.ErrorIs(t, err, io.EOF, "the kept-alive connection is closed")
	require.Eventually(t, func() bool { return serverGoroutines() == before }, 2*time.Second, 10*time.Millisecond)
	for _, port := range []uint16{32030, 32031} {
		eventually(t, c, tp.NodeIPs(), port, "/", refused)
	}
	assert.ErrorIs(t, hc.Sync(st), healthcheck.ErrClosed)
	assert.Empty(t, hc.Ports())
}

// health is a Runner's health that a test sets.
type health struct {
	mu sync.Mutex
	h  servicelb.Health
}

func (h *health) get() servicelb.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.h
}

func (h *health) set(v servicelb.Health) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h = v
}

// TestProxyServer: the proxy's health is served in the node's namespace on
// kube-proxy's port, /healthz and /livez flip with the runner's state and
// the node's eligibility, and Run closes the port when its context ends.
func TestProxyServer(t *testing.T) {
	tp := netnstest.New(t, netnstest.Options{Backends: 1})
	c := client(tp.Client)
	var hs health
	var eligible sync.Map
	eligible.Store("node", true)
	p, err := healthcheck.NewProxy(healthcheck.ProxyOptions{
		Health: hs.get, NetNS: tp.Node.NS, Addr: "[::]:10256", Timeout: time.Minute,
		NodeEligible: func() bool { v, _ := eligible.Load("node"); return v.(bool) },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	nodeIPs := tp.NodeIPs()
	body := func(a answer) map[string]any {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(a.body), &m), a.body)
		return m
	}

	hs.set(servicelb.Health{QueuedAt: time.Now()})
	for _, a := range eventually(t, c, nodeIPs, 10256, "/healthz", code(503)) {
		assert.Equal(t, false, body(a)["healthy"], "before the first sync")
		assert.Equal(t, true, body(a)["nodeEligible"])
		assert.Equal(t, "application/json", a.header.Get("Content-Type"))
		assert.Equal(t, "nosniff", a.header.Get("X-Content-Type-Options"))
	}
	for _, a := range eventually(t, c, nodeIPs, 10256, "/livez", code(200)) {
		assert.NotContains(t, body(a), "nodeEligible")
	}

	hs.set(servicelb.Health{Ready: true, AppliedAt: time.Now()})
	for _, a := range eventually(t, c, nodeIPs, 10256, "/healthz", code(200)) {
		m := body(a)
		assert.Equal(t, m["currentTime"], m["lastUpdated"])
		assert.Equal(t, true, m["healthy"])
	}

	t.Log("a change waits past the bound")
	applied := time.Now().Add(-2 * time.Minute).UTC().Truncate(time.Second)
	hs.set(servicelb.Health{Ready: true, AppliedAt: applied, QueuedAt: time.Now().Add(-time.Minute)})
	for _, a := range eventually(t, c, nodeIPs, 10256, "/healthz", code(503)) {
		assert.Equal(t, applied.Format(time.RFC3339Nano), body(a)["lastUpdated"])
	}
	eventually(t, c, nodeIPs, 10256, "/livez", code(503))

	t.Log("in sync again, the node not eligible")
	hs.set(servicelb.Health{Ready: true, AppliedAt: time.Now()})
	eligible.Store("node", false)
	for _, a := range eventually(t, c, nodeIPs, 10256, "/healthz", code(503)) {
		assert.Equal(t, false, body(a)["nodeEligible"])
		assert.Equal(t, true, body(a)["healthy"])
	}
	eventually(t, c, nodeIPs, 10256, "/livez", code(200))
	eventually(t, c, nodeIPs, 10256, "/", code(404))

	cancel()
	require.NoError(t, <-done)
	done <- nil
	eventually(t, c, nodeIPs, 10256, "/livez", refused)

	t.Log("a port taken is Run's error")
	var squatter net.Listener
	require.NoError(t, tp.Node.Do(func() error {
		var err error
		squatter, err = net.Listen("tcp", ":10257")
		return err
	}))
	defer squatter.Close()
	p2, err := healthcheck.NewProxy(healthcheck.ProxyOptions{Health: hs.get, NetNS: tp.Node.NS, Addr: ":10257"})
	require.NoError(t, err)
	assert.ErrorIs(t, p2.Run(context.Background()), syscall.EADDRINUSE)
}
