package servicelb

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJSONRoundTrip: a service written and read back is the same service;
// what is zero in Go is left out of the document.
func TestJSONRoundTrip(t *testing.T) {
	s := Service{
		Name: "ns/web", ClusterIPs: []netip.Addr{a("10.96.0.10")},
		Ports:    []Port{{Name: "http", Protocol: UDP, Port: 80, TargetPort: 8080, NodePort: 30080}, {Name: "web", Port: 8080}},
		Affinity: SessionAffinity{ClientIP: true, Timeout: 90 * time.Second},
		Endpoints: []Endpoint{
			{Addr: a("10.0.0.1"), Weight: Weight(3)},
			{Addr: a("10.0.0.2"), Ready: new(false), Serving: new(true), Terminating: true},
			{Addr: a("10.0.0.3"), Ready: new(false)},
			{Addr: a("10.0.0.4"), Ready: new(true), Serving: new(false)},
		},
	}
	b, err := json.Marshal(s)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"timeout":"1m30s"`)
	assert.Contains(t, string(b), `{"name":"web","port":8080}`, "an empty protocol is left out")
	assert.Contains(t, string(b), `{"addr":"10.0.0.1","weight":3}`, "nil conditions are left out")
	var back Service
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, s, back)
}

// TestJSONDefaults: what a document leaves out means what the Go API's
// zero values mean: WithDefaults' defaults, and endpoint conditions that
// say ready (as a Kubernetes EndpointSlice's absent ones do), in Go and
// in a document alike.
func TestJSONDefaults(t *testing.T) {
	var s Service
	require.NoError(t, json.Unmarshal([]byte(`{"name":"ns/a","clusterIPs":["10.96.0.1"],"ports":[{"port":80}],
		"affinity":{"clientIP":true},
		"endpoints":[{"addr":"10.0.0.1"},{"addr":"10.0.0.2","ready":false},{"addr":"10.0.0.3","ready":false,"serving":true,"terminating":true}]}`), &s))
	d := WithDefaults(s)
	assert.Equal(t, TCP, d.Ports[0].Protocol)
	assert.Equal(t, PolicyCluster, d.ExternalTrafficPolicy)
	assert.Equal(t, DefaultAffinityTimeout, d.Affinity.Timeout)
	assert.Equal(t, []Endpoint{
		{Addr: a("10.0.0.1")},
		{Addr: a("10.0.0.2"), Ready: new(false)},
		{Addr: a("10.0.0.3"), Ready: new(false), Serving: new(true), Terminating: true},
	}, s.Endpoints)
	var ready, serving []bool
	for _, e := range s.Endpoints {
		ready, serving = append(ready, e.IsReady()), append(serving, e.IsServing())
	}
	assert.Equal(t, []bool{true, false, false}, ready)
	assert.Equal(t, []bool{true, false, true}, serving)

	// The same service from Go, with its zero values, is the same state:
	// its zero endpoint serves.
	st1, err := NewState(NodeConfig{}, s)
	require.NoError(t, err)
	g := Service{Name: "ns/a", ClusterIPs: []netip.Addr{a("10.96.0.1")}, Ports: []Port{{Port: 80}},
		Affinity: SessionAffinity{ClientIP: true}, Endpoints: []Endpoint{
			{Addr: a("10.0.0.1")},
			{Addr: a("10.0.0.2"), Ready: new(false)},
			{Addr: a("10.0.0.3"), Ready: new(false), Serving: new(true), Terminating: true},
		}}
	st2, err := NewState(NodeConfig{}, g)
	require.NoError(t, err)
	ch := Diff(st1, st2)
	assert.True(t, ch.Empty())
	sp := st2.ServicePorts("ns/a")
	require.Len(t, sp, 1)
	require.Len(t, sp[0].Cluster, 1)
	assert.Equal(t, a("10.0.0.1"), sp[0].Cluster[0].Addr, "the zero endpoint is ready")
}

func TestJSONAffinityTimeout(t *testing.T) {
	var a SessionAffinity
	require.NoError(t, json.Unmarshal([]byte(`{"clientIP":true,"timeout":"10m"}`), &a))
	assert.Equal(t, 10*time.Minute, a.Timeout)
	err := json.Unmarshal([]byte(`{"clientIP":true,"timeout":600000000000}`), &a)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "duration string"), err.Error())
	require.Error(t, json.Unmarshal([]byte(`{"timeout":"ten minutes"}`), &a))
}
