package agent

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// TestHealthFlags: the proxy's health is served on kube-proxy's address
// and the health check node ports are on unless told otherwise; the bound
// on a change's wait is twice the max sync interval unless set.
func TestHealthFlags(t *testing.T) {
	var c Config
	fs := newFlagSet()
	c.RegisterFlags(fs)
	assert.Equal(t, "0.0.0.0:10256", c.HealthzBindAddress)
	assert.True(t, c.ServiceHealthChecks)
	assert.Equal(t, time.Minute, c.HealthTimeout())
	c.MaxSyncInterval = time.Hour
	assert.Equal(t, 2*time.Hour, c.HealthTimeout())
	c.HealthzTimeout = time.Second
	assert.Equal(t, time.Second, c.HealthTimeout())

	assert.NoError(t, fs.Parse([]string{"--healthz-bind-address=", "--health-check-node-ports=false"}))
	assert.Empty(t, c.HealthzBindAddress)
	assert.False(t, c.ServiceHealthChecks)
}

// watching is a source that follows the node: it delivers nothing and
// says the node is eligible while eligible holds.
type watching struct{ eligible atomic.Bool }

func (*watching) Name() string { return "watching" }

func (*watching) Run(ctx context.Context, dst *servicelb.Source, _ Reporter) error {
	dst.Synced()
	<-ctx.Done()
	return nil
}

func (w *watching) NodeEligible() bool { return w.eligible.Load() }

// TestNodeEligibleFromSources: a source that follows the node decides the
// node's eligibility: /healthz answers 503 with nodeEligible false while
// it says no, and /livez does not care.
func TestNodeEligibleFromSources(t *testing.T) {
	cfg := defaults()
	cfg.MinSyncInterval, cfg.HealthzBindAddress = 10*time.Millisecond, freeAddr(t)
	a, err := New(Options{Config: cfg, Dataplane: &fake.Proxier{}})
	require.NoError(t, err)
	w := &watching{}
	w.eligible.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, w) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })

	expect := func(path string, code int, body string) {
		t.Helper()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			resp, err := http.Get("http://" + cfg.HealthzBindAddress + path)
			if !assert.NoError(c, err) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(c, code, resp.StatusCode, path)
			assert.Contains(c, string(b), body, path)
		}, 5*time.Second, 10*time.Millisecond)
	}
	expect("/healthz", http.StatusOK, `"nodeEligible":true,"healthy":true`)
	w.eligible.Store(false)
	expect("/healthz", http.StatusServiceUnavailable, `"nodeEligible":false,"healthy":true`)
	expect("/livez", http.StatusOK, `"healthy":true`)
	w.eligible.Store(true)
	expect("/healthz", http.StatusOK, `"nodeEligible":true`)
}
