//go:build linux

package nftables

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func TestBucketCounts(t *testing.T) {
	weights := func(ws ...uint16) []servicelb.Backend {
		out := make([]servicelb.Backend, len(ws))
		for i, w := range ws {
			out[i].Weight = max(w, 1)
		}
		return out
	}
	// Shares that the buckets can hold exactly are exact, in as few
	// buckets as they take.
	for _, tc := range []struct {
		name string
		bs   []servicelb.Backend
		want []uint32
	}{
		{"one", weights(1), []uint32{1}},
		{"three even", weights(1, 1, 1), []uint32{1, 1, 1}},
		{"even and heavy", weights(100, 100), []uint32{1, 1}},
		{"uneven", weights(1, 2, 3, 10), []uint32{1, 2, 3, 10}},
		{"common divisor", weights(20, 30, 50), []uint32{2, 3, 5}},
		{"many", weights(make([]uint16, buckets)...), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := bucketCounts(tc.bs)
			if tc.want == nil {
				tc.want = make([]uint32, len(tc.bs))
				for i := range tc.want {
					tc.want[i] = 1
				}
			}
			assert.Equal(t, tc.want, got)
		})
	}
	// Shares that would take more buckets than there are come within one
	// bucket of exact, every backend keeping one.
	for _, tc := range []struct {
		name string
		bs   []servicelb.Backend
	}{
		{"tiny share", weights(1, 65535)},
		{"primes", weights(4093, 4091, 4079)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counts := bucketCounts(tc.bs)
			var total float64
			for _, b := range tc.bs {
				total += float64(b.Weight)
			}
			for i, c := range counts {
				assert.NotZero(t, c, "backend %d gets no bucket", i)
				want := float64(tc.bs[i].Weight) / total * buckets
				if want >= 1 {
					assert.InDelta(t, want, float64(c), 1, "backend %d", i)
				}
			}
			assert.Equal(t, uint32(buckets), sum(counts))
		})
	}
	assert.Nil(t, bucketCounts(weights(make([]uint16, buckets+1)...)), "more backends than buckets accepted")
}
