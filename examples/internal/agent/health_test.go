package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
