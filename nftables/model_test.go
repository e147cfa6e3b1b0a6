//go:build linux

package nftables

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// scaleState returns a State of n services of one TCP port, each with
// eps endpoints of its own.
func scaleState(t *testing.T, n, eps int) *servicelb.State {
	t.Helper()
	b, err := servicelb.NewBuilder(testNode)
	require.NoError(t, err)
	for i := range n {
		s := servicelb.Service{Name: fmt.Sprintf("ns/svc%d", i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}}}
		for j := range eps {
			x := i*eps + j
			s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 64 + byte(x>>16), byte(x >> 8), byte(x)})})
		}
		require.NoError(t, b.Upsert(s))
	}
	return b.State()
}

// TestModelHoldsLittleBesideTheState: the model of a State holds a port as
// its ServicePort and its slots, not its chains and elements, so that what
// it keeps beside the State is a small part of what the State holds.
func TestModelHoldsLittleBesideTheState(t *testing.T) {
	const n = 2000
	st := scaleState(t, n, 5)
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	p := newPlanner("kproxy", DefaultAffinitySize)
	before := heap()
	m, err := p.build(st)
	require.NoError(t, err)
	perPort := float64(heap()-before) / n
	runtime.KeepAlive(m)
	runtime.KeepAlive(st)
	t.Logf("%.0f bytes per port", perPort)
	assert.Less(t, perPort, 600.0, "bytes the model keeps per port of 5 endpoints")
}

// TestWriteAllocations: a cold sync plans and writes the table of a port
// with a few dozen allocations, its endpoints' elements included, not a
// few for each element.
func TestWriteAllocations(t *testing.T) {
	const n = 500
	st := scaleState(t, n, 10)
	p := newPlanner("kproxy", DefaultAffinitySize)
	allocs := testing.AllocsPerRun(3, func() {
		m, err := p.build(st)
		require.NoError(t, err)
		var batch nfnl.Batch
		require.NoError(t, p.write(m, &batch))
	})
	t.Logf("%.1f allocations per port", allocs/n)
	assert.Less(t, allocs/n, 60.0, "allocations per port of 10 endpoints")
}

// TestWriteAllocatesLittleBeyondItsBatch: a cold write's garbage is a
// small multiple of the batch it makes, whatever the number of backends
// maps it fills: what it allocates past the batch raises the peak memory
// of a cold sync.
func TestWriteAllocatesLittleBeyondItsBatch(t *testing.T) {
	const n = 2000
	p := newPlanner("kproxy", DefaultAffinitySize)
	m, err := p.build(scaleState(t, n, 5))
	require.NoError(t, err)
	var batch nfnl.Batch
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	require.NoError(t, p.write(m, &batch))
	runtime.ReadMemStats(&after)
	ratio := float64(after.TotalAlloc-before.TotalAlloc) / float64(batch.Size())
	t.Logf("%d shared sets: %.2f bytes allocated per byte of batch", len(m.shared), ratio)
	assert.Less(t, ratio, 5.0, "bytes allocated per byte of the batch")
}

// TestWriteSizesItsBatch: a cold sync grows its batch once, to about what
// the table takes: no more than half again, which a large table would
// hold in memory it never uses, and not less, which would copy it.
func TestWriteSizesItsBatch(t *testing.T) {
	for _, eps := range []int{5, 50} {
		p := newPlanner("kproxy", DefaultAffinitySize)
		m, err := p.build(scaleState(t, 500, eps))
		require.NoError(t, err)
		var batch nfnl.Batch
		require.NoError(t, p.write(m, &batch))
		size, _ := m.size()
		assert.GreaterOrEqual(t, size, batch.Size(), "%d endpoints a port: estimate", eps)
		assert.Less(t, float64(size), 1.5*float64(batch.Size()), "%d endpoints a port: estimate", eps)
	}
}
