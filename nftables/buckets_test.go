//go:build linux

package nftables

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// backends returns n backends of weight one, of addresses drawn from r.
func backends(r *rand.Rand, n int) []servicelb.Backend {
	out := make([]servicelb.Backend, n)
	for i := range out {
		out[i] = servicelb.Backend{Addr: netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))}), Port: 8080, Weight: 1}
	}
	return out
}

// bucketsOf returns, bucket by bucket, the backend owners assign it to.
func bucketsOf(bs []servicelb.Backend, owners []int32) []servicelb.Backend {
	out := make([]servicelb.Backend, len(owners))
	for j, o := range owners {
		out[j] = bs[o]
	}
	return out
}

// moved returns how many buckets go to another backend in b than in a,
// a bucket that only one of them has counting as moved.
func moved(a, b []servicelb.Backend) int {
	n := max(len(a), len(b)) - min(len(a), len(b))
	for j := range min(len(a), len(b)) {
		if a[j] != b[j] {
			n++
		}
	}
	return n
}

func TestBucketOwners(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 7, 50, 1000} {
		bs := backends(r, n)
		for i := range bs {
			bs[i].Weight = uint16(1 + r.IntN(5))
		}
		counts := bucketCounts(bs)
		owners := bucketOwners(bs, counts, sum(counts), nil)
		got := make([]uint32, n)
		for _, o := range owners {
			got[o]++
		}
		require.Equal(t, counts, got, "%d backends: buckets per backend", n)
		require.Equal(t, owners, bucketOwners(bs, counts, sum(counts), nil), "%d backends: made again", n)
	}
	// The many buckets of an uneven spread are placed too.
	bs := backends(r, 3)
	bs[0].Weight, bs[1].Weight, bs[2].Weight = 1, 65535, 2
	counts := bucketCounts(bs)
	owners := bucketOwners(bs, counts, sum(counts), nil)
	assert.Len(t, owners, buckets)
}

// TestBucketOwnersMoveLittle: an endpoint replaced, added or removed
// moves about log n of n buckets to another endpoint, wherever its
// address sorts: an assignment in the order of the addresses moves every
// bucket between the old address's place and the new one's, half of
// them on average.
func TestBucketOwnersMoveLittle(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	spread := func(bs []servicelb.Backend) []servicelb.Backend {
		bs = slices.Clone(bs)
		slices.SortFunc(bs, func(a, b servicelb.Backend) int { return a.Addr.Compare(b.Addr) })
		counts := bucketCounts(bs)
		return bucketsOf(bs, bucketOwners(bs, counts, sum(counts), nil))
	}
	for _, n := range []int{5, 10, 50, 200} {
		const trials = 200
		var replaced, added, removed int
		for range trials {
			bs := backends(r, n)
			before := spread(bs)
			j := r.IntN(n)
			other := slices.Clone(bs)
			other[j] = backends(r, 1)[0]
			replaced += moved(before, spread(other))
			added += moved(before, spread(append(slices.Clone(bs), backends(r, 1)...)))
			removed += moved(before, spread(slices.Delete(slices.Clone(bs), j, j+1)))
		}
		// At most 1 + log2 n on average: the replaced (added, removed)
		// endpoint's own bucket, and the tickets it displaces in turn.
		limit := 1 + math.Log2(float64(n))
		for what, total := range map[string]int{"replaced": replaced, "added": added, "removed": removed} {
			mean := float64(total) / trials
			assert.LessOrEqual(t, mean, limit, "%d endpoints, one %s: buckets moved, mean", n, what)
			t.Logf("%d endpoints, one %s: %.2f buckets moved, mean", n, what, mean)
		}
	}
}

// BenchmarkBucketOwners: the cost of placing the buckets of one set of
// endpoints, which a port's elements are made with.
func BenchmarkBucketOwners(b *testing.B) {
	for _, n := range []int{5, 50, buckets} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			bs := backends(rand.New(rand.NewPCG(5, 6)), n)
			counts := bucketCounts(bs)
			a := &arena{}
			for b.Loop() {
				a.reuseScratch()
				bucketOwners(bs, counts, sum(counts), a)
			}
		})
	}
}
