package servicelb

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A health check node port is TCP: a service that asks for the same
// number as a UDP node port, or stops asking for it, leaves the clash of
// two services over the health check node port as it is.
func TestHealthCheckClashOutlivesAUDPNodePort(t *testing.T) {
	local := func(name, vip string) Service {
		s := simple(name, vip, "10.0.0.1")
		s.Ports = s.Ports[:1]
		s.Ports[0].NodePort = 30100
		s.ExternalTrafficPolicy = PolicyLocal
		s.HealthCheckNodePort = 30081
		return s
	}
	udp := simple("c", "10.96.0.3", "10.0.0.1")
	udp.Ports = udp.Ports[1:]
	udp.Ports[0].NodePort = 30081

	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	require.NoError(t, b.Upsert(local("a", "10.96.0.1")))
	require.NoError(t, b.Upsert(local("b", "10.96.0.2")))
	want := []string{`health check node port 30081: held by "a", not served for "b"`, `node port 30100/TCP: held by "a", not served for "b"`}
	names := func() []string {
		var out []string
		for _, c := range b.Conflicts() {
			out = append(out, c.String())
		}
		return out
	}
	require.Equal(t, want, names())
	require.NoError(t, b.Upsert(udp))
	require.Equal(t, want, names(), "a UDP node port of that number added")
	require.True(t, b.Delete("c"))
	require.Equal(t, want, names(), "and deleted")
}
