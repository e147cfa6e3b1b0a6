package servicelb_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestHealthCheck: a service's health check counts its ready endpoints on
// this node as kube-proxy counts them, once per address and target port
// over every port, in one family (the larger count), and nothing else: not
// those of other nodes, not those serving while terminating (which the
// node still forwards to), not drained ones.
func TestHealthCheck(t *testing.T) {
	node := servicelb.NodeConfig{NodeName: "n1", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}}
	ep := func(addr, nodeName string, mut func(*servicelb.Endpoint)) servicelb.Endpoint {
		e := servicelb.Endpoint{Addr: netip.MustParseAddr(addr), NodeName: nodeName}
		if mut != nil {
			mut(&e)
		}
		return e
	}
	terminating := func(e *servicelb.Endpoint) { e.Ready, e.Serving, e.Terminating = new(false), new(true), true }
	lb := func(name string, hc uint16, eps ...servicelb.Endpoint) servicelb.Service {
		return servicelb.Service{
			Name:       name,
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
			Ports: []servicelb.Port{
				{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080},
				{Name: "https", Protocol: servicelb.TCP, Port: 443, NodePort: 30443},
			},
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			HealthCheckNodePort:   hc,
			Endpoints:             eps,
		}
	}
	sameTarget := func(s servicelb.Service) servicelb.Service {
		s.Ports[0].TargetPort, s.Ports[1].TargetPort = 8080, 8080
		return s
	}
	for _, tc := range []struct {
		name string
		svc  servicelb.Service
		want int
	}{
		{"one address on two target ports counts twice", lb("d/a", 31000,
			ep("10.244.1.2", "n1", nil), ep("10.244.2.2", "n2", nil)), 2},
		{"one address on one target port counts once", sameTarget(lb("d/a", 31000,
			ep("10.244.1.2", "n1", nil), ep("10.244.2.2", "n2", nil))), 1},
		{"a dual-stack endpoint counts in one family", lb("d/a", 31000,
			ep("10.244.1.2", "n1", nil), ep("fd00:244:1::2", "n1", nil)), 2},
		{"the family with more counts", lb("d/a", 31000,
			ep("10.244.1.2", "n1", nil), ep("fd00:244:1::2", "n1", nil), ep("10.244.1.3", "n1", nil)), 4},
		{"only terminating endpoints here", lb("d/a", 31000,
			ep("10.244.1.2", "n1", terminating), ep("10.244.2.2", "n2", nil)), 0},
		{"ready beside terminating", lb("d/a", 31000,
			ep("10.244.1.2", "n1", terminating), ep("10.244.1.3", "n1", nil)), 2},
		{"drained", lb("d/a", 31000,
			ep("10.244.1.2", "n1", func(e *servicelb.Endpoint) { e.Weight = servicelb.Weight(0) })), 0},
		{"not ready", lb("d/a", 31000,
			ep("10.244.1.2", "n1", func(e *servicelb.Endpoint) { e.Ready, e.Serving = new(false), new(false) })), 0},
		{"no endpoints", lb("d/a", 31000), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := servicelb.NewState(node, tc.svc)
			require.NoError(t, err)
			hc, ok := st.HealthCheck("d/a")
			require.True(t, ok)
			assert.Equal(t, servicelb.HealthCheck{Service: "d/a", Port: 31000, LocalEndpoints: tc.want}, hc)
		})
	}

	t.Run("services without one, or without the port", func(t *testing.T) {
		a := lb("d/a", 31000, ep("10.244.1.2", "n1", nil))
		b := lb("d/b", 31000, ep("10.244.1.3", "n1", nil))
		b.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
		b.Ports[0].NodePort, b.Ports[1].NodePort = 30081, 30444
		c := lb("d/c", 0, ep("10.244.1.4", "n1", nil))
		c.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.12")}
		c.Ports[0].NodePort, c.Ports[1].NodePort = 30082, 30445
		d := lb("d/d", 31001)
		d.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.13")}
		d.Ports[0].NodePort, d.Ports[1].NodePort = 30083, 30446
		st, err := servicelb.NewState(node, a, b, c, d)
		require.NoError(t, err)
		for _, name := range []string{"d/b", "d/c", "d/none"} {
			_, ok := st.HealthCheck(name)
			assert.False(t, ok, name)
		}
		assert.Equal(t, []servicelb.HealthCheck{
			{Service: "d/a", Port: 31000, LocalEndpoints: 2},
			{Service: "d/d", Port: 31001},
		}, st.HealthChecks())
	})
}
