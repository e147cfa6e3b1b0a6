package benchwork

import (
	"net"
	"testing"
	"time"
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
