package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/kproxy-dev/kproxy/servicelb"
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

// TestChangeCountersNeverGoBack: counts of changes that arrive late are
// ignored, so that the counters never go back.
func TestChangeCountersNeverGoBack(t *testing.T) {
	m := NewMetrics("nftables", func() servicelb.Health { return servicelb.Health{} })
	m.kube.changed(servicelb.ChangeStats{Services: 3, Endpoints: 5, ServicesPending: 1})
	m.kube.changed(servicelb.ChangeStats{Services: 2, Endpoints: 5})
	assert.Equal(t, servicelb.ChangeStats{Services: 3, Endpoints: 5, ServicesPending: 1}, m.kube.changes)
	m.kube.changed(servicelb.ChangeStats{Services: 3, Endpoints: 5})
	assert.Equal(t, servicelb.ChangeStats{Services: 3, Endpoints: 5}, m.kube.changes)
}
