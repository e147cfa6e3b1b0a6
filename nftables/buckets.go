//go:build linux

package nftables

import (
	"cmp"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// bucketCounts shares buckets among the backends in proportion to their
// weights: as many as the weights divided by their greatest common
// divisor (one each when they are equal), so that the shares are exact;
// or, when those add up to more than buckets, all of them in proportion
// (largest remainder first), at least one each. It returns nil when there
// are more backends than buckets.
func bucketCounts(bs []servicelb.Backend) []uint32 {
	n := len(bs)
	if n == 0 || n > buckets {
		return nil
	}
	g := uint64(0)
	var total uint64
	for _, b := range bs {
		g = gcd(g, uint64(max(b.Weight, 1)))
		total += uint64(max(b.Weight, 1))
	}
	counts := make([]uint32, n)
	if total/g <= buckets {
		for i, b := range bs {
			counts[i] = uint32(uint64(max(b.Weight, 1)) / g)
		}
		return counts
	}
	rems := make([]uint64, n)
	sum := uint32(0)
	for i, b := range bs {
		share := uint64(max(b.Weight, 1)) * buckets
		counts[i] = uint32(share / total)
		rems[i] = share % total
		if counts[i] == 0 {
			counts[i], rems[i] = 1, 0
		}
		sum += counts[i]
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	// Largest remainders gain the missing buckets; when the floor of one
	// bucket each overshoots, the largest counts give buckets back.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rems[b], rems[a]) })
	for i := 0; sum < buckets; i = (i + 1) % n {
		counts[order[i]]++
		sum++
	}
	for sum > buckets {
		big := 0
		for i := range counts {
			if counts[i] > counts[big] {
				big = i
			}
		}
		counts[big]--
		sum--
	}
	return counts
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// sum returns the number of buckets counts share.
func sum(counts []uint32) uint32 {
	var s uint32
	for _, c := range counts {
		s += c
	}
	return s
}
