package benchwork

import (
	"fmt"
	"slices"
)

// Median returns the median of xs (the mean of the two middle values of
// an even count), or 0 for none. It leaves xs as it was.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Verdict says whether a measured path keeps within a tolerance of a
// reference one: Ratio is the median of the ratios of rounds taken in
// turn (path over reference), so that a round the rest of the machine
// slowed weighs on both sides of its own ratio and one odd round does
// not decide.
type Verdict struct {
	Ratio     float64 // median ratio of the rounds
	Rounds    int
	Tolerance float64 // 0.05: within 5%
}

// Judge returns the verdict over the rounds' ratios.
func Judge(ratios []float64, tolerance float64) Verdict {
	return Verdict{Ratio: Median(ratios), Rounds: len(ratios), Tolerance: tolerance}
}

// Within reports whether the median ratio lies within the tolerance of 1
// either way.
func (v Verdict) Within() bool {
	return v.Rounds > 0 && v.Ratio >= 1-v.Tolerance && v.Ratio <= 1+v.Tolerance
}

func (v Verdict) String() string {
	word := "within"
	if !v.Within() {
		word = "NOT within"
	}
	return fmt.Sprintf("%.3fx (median of %d rounds): %s %.0f%% of the reference", v.Ratio, v.Rounds, word, v.Tolerance*100)
}
