//go:build linux

package nftables

import (
	"cmp"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// bucketCounts shares the slot's buckets among the backends in proportion
// to their weights (largest remainder first), giving each at least one. It
// returns nil when there are more backends than buckets.
func bucketCounts(bs []servicelb.Backend) []uint32 {
	n := len(bs)
	if n == 0 || n > buckets {
		return nil
	}
	var total uint64
	equal := true
	for _, b := range bs {
		total += uint64(b.Weight)
		equal = equal && b.Weight == bs[0].Weight
	}
	counts := make([]uint32, n)
	if equal {
		// Every remainder is the same: the first ones gain the buckets
		// left over, as the stable sort below would give them.
		for i := range counts {
			counts[i] = uint32(buckets / n)
			if i < buckets%n {
				counts[i]++
			}
		}
		return counts
	}
	rems := make([]uint64, n)
	sum := uint32(0)
	for i, b := range bs {
		share := uint64(b.Weight) * buckets
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
