package servicelb

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEndpointsComeBackAsGiven: a State gives back each endpoint exactly as
// it was given, whatever it sets: pointers set to false or left nil, an
// empty map and none, a zone on an address, an IPv4-mapped IPv6 address.
func TestEndpointsComeBackAsGiven(t *testing.T) {
	eps := []Endpoint{
		{Addr: a("10.0.0.1")},
		{Addr: a("10.0.0.2"), Ready: new(false), Serving: new(true), Terminating: true, NodeName: "n1", Zone: "z1", Weight: Weight(0)},
		{Addr: a("10.0.0.3"), Ready: new(true), Serving: new(false), Weight: Weight(65535), OnlyNamedPorts: true, Ports: map[string]uint16{"tcp": 8080}},
		{Addr: a("10.0.0.4"), Ports: map[string]uint16{}, Hints: Hints{ForZones: []string{"z1", "z2"}}},
		{Addr: a("10.0.0.5"), Hints: Hints{ForNodes: []string{}}},
		{Addr: a("fd00::1"), NodeName: "n2"},
		{Addr: a("::ffff:10.0.0.6")},
		{Addr: a("fe80::1%eth0"), Zone: "z2"},
	}
	got := decodeEndpoints(encodeEndpoints(eps))
	require.Len(t, got, len(eps))
	for i := range eps {
		assert.Equal(t, eps[i], got[i], "endpoint %d", i)
	}
	assert.Nil(t, decodeEndpoints(encodeEndpoints(nil)))

	b, err := NewBuilder(NodeConfig{})
	require.NoError(t, err)
	in := simple("s", "10.96.0.1")
	in.Endpoints = eps[:6]
	require.NoError(t, b.Upsert(in))
	svc, ok := b.State().Service("s")
	require.True(t, ok)
	assert.Equal(t, WithDefaults(in), *svc)
}

// TestEndpointChangesAreSeen: two endpoints that differ in any one field
// differ in the State's form too, so that a Builder takes the change and
// Diff reports it.
func TestEndpointChangesAreSeen(t *testing.T) {
	base := Endpoint{Addr: a("10.0.0.1"), NodeName: "n1", Zone: "z1", Ports: map[string]uint16{"tcp": 81}, Hints: Hints{ForZones: []string{"z1"}}}
	changes := map[string]func(e *Endpoint){
		"addr":             func(e *Endpoint) { e.Addr = a("10.0.0.2") },
		"addr-4in6":        func(e *Endpoint) { e.Addr = a("::ffff:10.0.0.1") },
		"ports":            func(e *Endpoint) { e.Ports = map[string]uint16{"tcp": 82} },
		"ports-empty":      func(e *Endpoint) { e.Ports = map[string]uint16{} },
		"ports-nil":        func(e *Endpoint) { e.Ports = nil },
		"only-named-ports": func(e *Endpoint) { e.OnlyNamedPorts = true },
		"ready-true":       func(e *Endpoint) { e.Ready = new(true) },
		"ready-false":      func(e *Endpoint) { e.Ready = new(false) },
		"serving":          func(e *Endpoint) { e.Serving = new(true) },
		"terminating":      func(e *Endpoint) { e.Terminating = true },
		"node":             func(e *Endpoint) { e.NodeName = "n2" },
		"node-none":        func(e *Endpoint) { e.NodeName = "" },
		"zone":             func(e *Endpoint) { e.Zone = "z2" },
		"hints-zones":      func(e *Endpoint) { e.Hints.ForZones = []string{"z2"} },
		"hints-nodes":      func(e *Endpoint) { e.Hints.ForNodes = []string{"n1"} },
		"weight":           func(e *Endpoint) { e.Weight = Weight(DefaultWeight) },
	}
	r := encodeEndpoint(&base)
	for name, change := range changes {
		e := base
		change(&e)
		c := encodeEndpoint(&e)
		assert.False(t, r.equal(&c), "%s: the change is not seen", name)
		assert.Equal(t, e, c.endpoint(), name)
	}
	again := base
	again.Ports = map[string]uint16{"tcp": 81}
	c := encodeEndpoint(&again)
	assert.True(t, r.equal(&c), "equal endpoints differ")
}

// TestStateHoldsAnEndpointCompactly: what a State keeps for each endpoint
// of a service of one port: its compact form, its Backend in the port's
// Cluster set and its addresses in the deprecated lists Serving and
// Hairpin, not a copy of the Endpoint beside them.
func TestStateHoldsAnEndpointCompactly(t *testing.T) {
	const n = 2000
	node := NodeConfig{NodeName: "n0"}
	heap := func(eps int) int64 {
		runtime.GC()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := NewBuilder(node)
		require.NoError(t, err)
		for i := range n {
			s := Service{Name: fmt.Sprintf("ns/s%d", i), ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
				Ports: []Port{{Name: "http", Protocol: TCP, Port: 80, TargetPort: 8080}}}
			for j := range eps {
				x := i*eps + j
				s.Endpoints = append(s.Endpoints, Endpoint{Addr: netip.AddrFrom4([4]byte{10, 64 + byte(x>>16), byte(x >> 8), byte(x)}), NodeName: fmt.Sprintf("n%d", x%50)})
			}
			require.NoError(t, b.Upsert(s))
		}
		st := b.State()
		runtime.GC()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(st)
		return int64(after.HeapAlloc) - int64(before.HeapAlloc)
	}
	small, large := heap(4), heap(20)
	perEndpoint := float64(large-small) / (n * 16)
	t.Logf("%.0f bytes per endpoint", perEndpoint)
	// 48 for the endpoint and 32 for its Backend, and, until the next
	// minor release removes the deprecated lists, 32 for its Serving and
	// 24 for its Hairpin address, with the slack of the allocator's size
	// classes; a copy of the Endpoint would add 152.
	assert.Less(t, perEndpoint, 160.0, "bytes a State holds per endpoint")
}
