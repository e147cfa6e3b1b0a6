//go:build privileged

package agent

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// reports collects the objects an agent reports invalid.
type reports struct {
	mu  sync.Mutex
	got []string
}

func (r *reports) add(object string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, object+": "+err.Error())
}

func (r *reports) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// TestHealthServersInNetNS: the agent serves the proxy's health and each
// Local service's health check node port in its --netns namespace, where
// the sandbox's client reaches them on the node's address; a port another
// program holds is reported once, naming the service, and served once
// free; everything closes when the agent stops.
func TestHealthServersInNetNS(t *testing.T) {
	testutil.RequireRoot(t)
	sb, err := sandbox.New(sandbox.Options{Backends: 1})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sb.Close()) })
	var squatter net.Listener
	require.NoError(t, sandbox.In(sb.Node.NS, func() error {
		var err error
		squatter, err = net.Listen("tcp", ":31001")
		return err
	}))
	defer squatter.Close()

	cfg := defaults()
	cfg.NetNS, cfg.NodeName, cfg.NodeIPs = sb.Node.NSName, "n1", sandbox.NodeAddr.String()
	cfg.MinSyncInterval = 10 * time.Millisecond
	cfg.HealthzBindAddress, cfg.ServiceHealthChecks = netip.AddrPortFrom(sandbox.NodeAddr, 10256).String(), true
	p := &fake.Proxier{}
	var rep reports
	a, err := New(Options{Config: cfg, Dataplane: p, OnInvalid: rep.add})
	require.NoError(t, err)
	src := a.Runner().Source("test")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
		a.Close()
	})

	lb := func(name string, hc uint16, nodeName string, last byte) servicelb.Service {
		return servicelb.Service{
			Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, last})},
			Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30000 + uint16(last)}},
			ExternalTrafficPolicy: servicelb.PolicyLocal, HealthCheckNodePort: hc,
			Endpoints: []servicelb.Endpoint{{Addr: sandbox.BackendAddr(1), NodeName: nodeName}},
		}
	}
	c := sb.Client.HTTPClient(time.Second)
	get := func(port uint16, path string) (int, error) {
		resp, err := c.Get("http://" + netip.AddrPortFrom(sandbox.NodeAddr, port).String() + path)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	expect := func(port uint16, path string, want int) {
		t.Helper()
		var code int
		var err error
		require.Eventually(t, func() bool {
			code, err = get(port, path)
			return err == nil && code == want
		}, 5*time.Second, 20*time.Millisecond, "port %d%s: want %d, got %d, %v", port, path, want, code, err)
	}

	require.NoError(t, src.Upsert(lb("ns/a", 31000, "n1", 1), lb("ns/b", 31001, "n1", 2)))
	src.Synced()
	expect(31000, "/", http.StatusOK)
	expect(10256, "/healthz", http.StatusOK)
	expect(10256, "/livez", http.StatusOK)

	t.Log("a's endpoint moves to another node; more syncs do not repeat b's report")
	require.NoError(t, src.Upsert(lb("ns/a", 31000, "n2", 1)))
	expect(31000, "/", http.StatusServiceUnavailable)
	got := rep.all()
	require.Len(t, got, 1, "one report: %q", got)
	assert.True(t, strings.HasPrefix(got[0], `ns/b: service "ns/b": health check node port 31001`), got[0])
	assert.Contains(t, got[0], syscall.EADDRINUSE.Error())

	t.Log("the port is freed: the next sync serves b")
	require.NoError(t, squatter.Close())
	require.NoError(t, src.Upsert(lb("ns/a", 31000, "n1", 1)))
	expect(31000, "/", http.StatusOK)
	expect(31001, "/", http.StatusOK)
	assert.Len(t, rep.all(), 1)

	cancel()
	require.NoError(t, <-done)
	stopped = true
	for _, port := range []uint16{31000, 31001, 10256} {
		_, err := get(port, "/livez")
		assert.ErrorIs(t, err, syscall.ECONNREFUSED, "port %d after the agent stopped", port)
	}
}
