//go:build linux

package nftables

import (
	"math"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func TestBucketCounts(t *testing.T) {
	weights := func(ws ...uint16) []servicelb.Backend {
		out := make([]servicelb.Backend, len(ws))
		for i, w := range ws {
			out[i].Weight = w
		}
		return out
	}
	for _, tc := range []struct {
		name string
		bs   []servicelb.Backend
	}{
		{"one", weights(1)},
		{"three even", weights(1, 1, 1)},
		{"uneven", weights(1, 2, 3, 10)},
		{"tiny share", weights(1, 65535)},
		{"many", weights(make([]uint16, 4095)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.bs {
				if tc.bs[i].Weight == 0 {
					tc.bs[i].Weight = 1
				}
			}
			counts := bucketCounts(tc.bs)
			var sum uint32
			var total float64
			for _, b := range tc.bs {
				total += float64(b.Weight)
			}
			for i, c := range counts {
				if c == 0 {
					t.Errorf("backend %d gets no bucket", i)
				}
				sum += c
				want := float64(tc.bs[i].Weight) / total * buckets
				if math.Abs(float64(c)-want) > 1 && want >= 1 {
					t.Errorf("backend %d: %d buckets, want %.2f", i, c, want)
				}
			}
			if sum != buckets {
				t.Errorf("%d buckets in all, want %d", sum, buckets)
			}
		})
	}
	if bucketCounts(weights(make([]uint16, buckets+1)...)) != nil {
		t.Error("more backends than buckets accepted")
	}
}
