//go:build linux

package netnstest

import (
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"
)

// exactTails computes P(X < lo) and P(X > hi) for X ~ binomial(n, p) with
// exact rational arithmetic, as an oracle independent of the float code.
func exactTails(n int, p *big.Rat, lo, hi int) (below, above *big.Rat) {
	below, above = new(big.Rat), new(big.Rat)
	q := new(big.Rat).Sub(big.NewRat(1, 1), p)
	for x := 0; x <= n; x++ {
		if x >= lo && x <= hi {
			continue
		}
		term := new(big.Rat).SetInt(new(big.Int).Binomial(int64(n), int64(x)))
		for range x {
			term.Mul(term, p)
		}
		for range n - x {
			term.Mul(term, q)
		}
		if x < lo {
			below.Add(below, term)
		} else {
			above.Add(above, term)
		}
	}
	return below, above
}

// TestBinomialBoundsAreExactAndNarrowest checks with exact arithmetic that
// each tail outside the interval is at most alpha/2 and that widening
// neither end by one would stay within it (the interval is the narrowest).
func TestBinomialBoundsAreExactAndNarrowest(t *testing.T) {
	for _, c := range []struct {
		n        int
		num, den int64
		alpha    float64
	}{{20, 1, 2, 0.05}, {60, 1, 3, 1e-3}, {120, 1, 10, 1e-6}, {90, 2, 3, 1e-4}} {
		p := big.NewRat(c.num, c.den)
		pf, _ := p.Float64()
		lo, hi := BinomialBounds(c.n, pf, c.alpha)
		half := new(big.Rat).SetFloat64(c.alpha / 2)
		below, above := exactTails(c.n, p, lo, hi)
		if below.Cmp(half) > 0 || above.Cmp(half) > 0 {
			t.Errorf("n=%d p=%v: [%d,%d] tails %s, %s exceed %v", c.n, p, lo, hi,
				below.FloatString(12), above.FloatString(12), c.alpha/2)
		}
		below, _ = exactTails(c.n, p, lo+1, hi)
		_, above = exactTails(c.n, p, lo, hi-1)
		if below.Cmp(half) <= 0 || above.Cmp(half) <= 0 {
			t.Errorf("n=%d p=%v: [%d,%d] is not the narrowest", c.n, p, lo, hi)
		}
	}
}

func TestBinomialBoundsEdges(t *testing.T) {
	for _, c := range []struct {
		n      int
		p      float64
		lo, hi int
	}{{100, 0, 0, 0}, {100, 1, 100, 100}, {0, 0.5, 0, 0}} {
		if lo, hi := BinomialBounds(c.n, c.p, 1e-6); lo != c.lo || hi != c.hi {
			t.Errorf("BinomialBounds(%d, %v) = %d, %d; want %d, %d", c.n, c.p, lo, hi, c.lo, c.hi)
		}
	}
}

// TestWithinBoundsAcceptsCorrectSpreads draws many correct random spreads:
// with a false alarm rate of 1e-6, none of them may fail.
func TestWithinBoundsAcceptsCorrectSpreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shares := WeightedShares(map[string]float64{"a": 1, "b": 2, "c": 3, "d": 0})
	for range 2000 {
		counts := map[string]int{}
		for range 300 {
			x := rng.Float64() * 6
			switch {
			case x < 1:
				counts["a"]++
			case x < 3:
				counts["b"]++
			default:
				counts["c"]++
			}
		}
		if err := WithinBounds(counts, shares, 300); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWithinBoundsRejectsWrongSpreads(t *testing.T) {
	even := EvenShares("backend-0", "backend-1", "backend-2")
	for name, c := range map[string]struct {
		counts map[string]int
		shares map[string]float64
		n      int
		want   string
	}{
		"one backend missing":    {map[string]int{"backend-0": 150, "backend-1": 150}, even, 300, "backend-2: 0 not in"},
		"half on one":            {map[string]int{"backend-0": 600, "backend-1": 300, "backend-2": 300}, even, 1200, "backend-0: 600 not in"},
		"unexpected host":        {map[string]int{"backend-0": 100, "backend-1": 100, "backend-2": 99, "client": 1}, even, 300, "client: 1 not in [0, 0]"},
		"failures counted":       {map[string]int{"backend-0": 100, "backend-1": 100, "backend-2": 99, KeyTimeout: 1}, even, 300, "timeout: 1"},
		"draining host answered": {map[string]int{"a": 299, "b": 1}, map[string]float64{"a": 1, "b": 0}, 300, "b: 1 not in [0, 0]"},
		"counts short of n":      {map[string]int{"a": 100, "b": 100}, EvenShares("a", "b"), 300, "counts sum to 200, want 300"},
		"shares not summing":     {map[string]int{"a": 1}, map[string]float64{"a": 0.5}, 1, "do not sum to 1"},
	} {
		err := WithinBounds(c.counts, c.shares, c.n)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", name, err, c.want)
		}
	}
}
