//go:build linux

package netnstest

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// FalseAlarm is the probability with which WithinBounds rejects counts
// drawn from the expected distribution.
const FalseAlarm = 1e-6

// WithinBounds checks counts, as Count returns them, against the expected
// share of each host (shares sum to 1) for n asks, and returns an error
// naming every host whose count lies outside its bounds, or nil.
//
// The maths: if each of n asks independently picks host h with
// probability p, h's count X is binomial(n, p). For each of the k hosts
// with 0 < p < 1, BinomialBounds gives the interval [lo, hi] with
// P(X < lo) <= a/2 and P(X > hi) <= a/2 for a = FalseAlarm/k, summing the
// exact binomial probabilities (no normal approximation, so the bound also
// holds for small n and skewed p). By the union bound (which needs no
// independence between the hosts' counts) a correct random spread fails
// with probability at most FalseAlarm. A host with share 0 must have count
// 0, one with share 1 must have n, and counts of hosts without a share
// (or failures counted by CountFailures) fail the check.
//
// The price of such a small false alarm rate is width: with 3 equal
// shares, n = 300 accepts 60..143 per host, and n = 1200 accepts 318..485.
// Pick n for the smallest deviation the test must catch.
func WithinBounds(counts map[string]int, shares map[string]float64, n int) error {
	if err := checkShares(shares); err != nil {
		return err
	}
	k := 0
	for _, p := range shares {
		if p > 0 && p < 1 {
			k++
		}
	}
	alpha := FalseAlarm / float64(max(k, 1))
	var bad []string
	total := 0
	for _, host := range keys(counts, shares) {
		c, p := counts[host], shares[host]
		total += c
		lo, hi := BinomialBounds(n, p, alpha)
		if c < lo || c > hi {
			bad = append(bad, fmt.Sprintf("%s: %d not in [%d, %d] (share %.4g)", host, c, lo, hi, p))
		}
	}
	if total != n {
		bad = append(bad, fmt.Sprintf("counts sum to %d, want %d", total, n))
	}
	if len(bad) > 0 {
		return fmt.Errorf("distribution of %d asks out of bounds: %s (counts %v)", n, strings.Join(bad, "; "), counts)
	}
	return nil
}

func checkShares(shares map[string]float64) error {
	sum := 0.0
	for h, p := range shares {
		if math.IsNaN(p) || p < 0 || p > 1 {
			return fmt.Errorf("share of %s is %v, want 0..1", h, p)
		}
		sum += p
	}
	if math.Abs(sum-1) > 1e-9 {
		return errors.New("shares do not sum to 1")
	}
	return nil
}

// keys returns the names in either map, sorted.
func keys(counts map[string]int, shares map[string]float64) []string {
	var out []string
	for h := range counts {
		out = append(out, h)
	}
	for h := range shares {
		out = append(out, h)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// EvenShares returns equal shares for the named hosts.
func EvenShares(hosts ...string) map[string]float64 {
	out := make(map[string]float64, len(hosts))
	for _, h := range hosts {
		out[h] = 1 / float64(len(hosts))
	}
	return out
}

// WeightedShares returns shares proportional to the weights.
func WeightedShares(weights map[string]float64) map[string]float64 {
	sum := 0.0
	for _, w := range weights {
		sum += w
	}
	out := make(map[string]float64, len(weights))
	for h, w := range weights {
		out[h] = w / sum
	}
	return out
}

// BinomialBounds returns the narrowest interval [lo, hi] such that a
// binomial(n, p) count falls below lo with probability at most alpha/2 and
// above hi with probability at most alpha/2, from the exact distribution.
func BinomialBounds(n int, p, alpha float64) (lo, hi int) {
	switch {
	case n <= 0:
		return 0, 0
	case p <= 0:
		return 0, 0
	case p >= 1:
		return n, n
	}
	pmf := binomialPMF(n, p)
	tail := 0.0
	for lo < n && tail+pmf[lo] <= alpha/2 {
		tail += pmf[lo]
		lo++
	}
	tail, hi = 0, n
	for hi > 0 && tail+pmf[hi] <= alpha/2 {
		tail += pmf[hi]
		hi--
	}
	return lo, hi
}

// binomialPMF returns P(X = x) for x = 0..n, computed in log space so that
// large n neither overflows nor underflows before the tails matter.
func binomialPMF(n int, p float64) []float64 {
	out := make([]float64, n+1)
	lgN, _ := math.Lgamma(float64(n + 1))
	lp, lq := math.Log(p), math.Log1p(-p)
	for x := range out {
		lgX, _ := math.Lgamma(float64(x + 1))
		lgR, _ := math.Lgamma(float64(n - x + 1))
		out[x] = math.Exp(lgN - lgX - lgR + float64(x)*lp + float64(n-x)*lq)
	}
	return out
}
