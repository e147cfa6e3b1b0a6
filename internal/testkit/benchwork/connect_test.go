package benchwork

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := closed.Addr().String()
	closed.Close()

	lat, err := Connect([]string{ln.Addr().String(), refused}, 40, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if lat.N != 20 || lat.Failed != 20 {
		t.Errorf("%d connections and %d failures, want 20 each (round robin over both targets)", lat.N, lat.Failed)
	}
	if lat.P50 <= 0 || lat.P99 < lat.P50 {
		t.Errorf("p50 %v µs, p99 %v µs", lat.P50, lat.P99)
	}
	if _, err := Connect([]string{refused}, 3, time.Second); err == nil {
		t.Error("no connection succeeded, and no error")
	}
}

func TestPercentiles(t *testing.T) {
	var times []float64
	for i := 100; i >= 1; i-- {
		times = append(times, float64(i))
	}
	l, err := Percentiles(times, 3)
	if err != nil {
		t.Fatal(err)
	}
	if l != (Latency{P50: 51, P99: 100, N: 100, Failed: 3}) {
		t.Errorf("%+v", l)
	}
	if times[0] != 100 {
		t.Error("the samples were sorted in place")
	}
	if _, err := Percentiles(nil, 2); err == nil {
		t.Error("no samples, no error")
	}
}

// TestConnectBoth: n connections through the targets and n direct ones,
// each side's percentiles apart; either side without a connection
// fails, saying which.
func TestConnectBoth(t *testing.T) {
	listen := func() (addr string, accepted *atomic.Int64) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		accepted = new(atomic.Int64)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		return ln.Addr().String(), accepted
	}
	vip, vipConns := listen()
	direct, directConns := listen()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := closed.Addr().String()
	closed.Close()

	// Half of the direct connections are refused: the two sides are
	// told apart.
	through, routed, err := ConnectBoth([]string{vip}, []string{direct, refused}, 120, time.Second)
	require.NoError(t, err)
	assert.Equal(t, Latency{P50: through.P50, P99: through.P99, N: 120}, through)
	assert.Equal(t, Latency{P50: routed.P50, P99: routed.P99, N: 60, Failed: 60}, routed)
	assert.Eventually(t, func() bool { return vipConns.Load() == 120 && directConns.Load() == 60 },
		5*time.Second, 10*time.Millisecond, "each listener gets its own connections")

	_, _, err = ConnectBoth([]string{vip}, []string{refused}, 3, time.Second)
	assert.ErrorContains(t, err, "direct")
	_, _, err = ConnectBoth([]string{refused}, []string{direct}, 3, time.Second)
	assert.ErrorContains(t, err, "through the services")
}
