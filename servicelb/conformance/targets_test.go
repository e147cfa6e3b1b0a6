//go:build linux

package conformance

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTargetsAndOrigins: the frontends and origins are constants whose
// Of, OnPort, OutsideAt and Endpoint keep every part of the value apart.
func TestTargetsAndOrigins(t *testing.T) {
	for _, tc := range []struct {
		t    Target
		kind targetKind
		svc  int
		port uint16
		name string
	}{
		{ClusterIP, toClusterIP, 0, 0, "cluster IP"},
		{NodePort.Of(3), toNodePort, 3, 0, "node port of service 3"},
		{ExternalIP.OnPort(8080), toExternalIP, 0, 8080, "external IP port 8080"},
		{HealthCheckNodePort.Of(2).OnPort(65535).Of(5), toHealthCheckNodePort, 5, 65535, "health check node port of service 5 port 65535"},
		{LoadBalancerIP.OnPort(1).Of(255).OnPort(2), toLoadBalancerIP, 255, 2, "load-balancer IP of service 255 port 2"},
	} {
		assert.Equal(t, tc.kind, tc.t.kind(), tc.name)
		assert.Equal(t, tc.svc, tc.t.svc(), tc.name)
		assert.Equal(t, tc.port, tc.t.port(), tc.name)
		assert.Equal(t, tc.name, tc.t.String())
	}
	assert.Equal(t, "outside", Outside.String())
	assert.Equal(t, "outside#7", OutsideAt(7).String())
	assert.Equal(t, fromOutside, OutsideAt(7).kind())
	assert.Equal(t, "endpoint 2", Endpoint(2).String())
	assert.Equal(t, 2, Endpoint(2).n())
	assert.Equal(t, "bridged pod", BridgedPod.String())
}
