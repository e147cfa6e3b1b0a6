package benchwork

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMedian(t *testing.T) {
	xs := []float64{3, 1, 2}
	assert.Equal(t, 2.0, Median(xs))
	assert.Equal(t, []float64{3, 1, 2}, xs, "the input keeps its order")
	assert.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	assert.Equal(t, 0.0, Median(nil))
}

func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		ratios []float64
		within bool
	}{
		{[]float64{0.97, 1.01, 1.02}, true},
		{[]float64{0.80, 0.99, 1.20}, true}, // one odd round either way does not decide
		{[]float64{0.90, 0.93, 1.01}, false},
		{[]float64{1.06, 1.07, 0.99}, false},
		{nil, false},
	} {
		v := Judge(tc.ratios, 0.05)
		assert.Equal(t, tc.within, v.Within(), "%v: %s", tc.ratios, v)
	}
	assert.Equal(t, "0.930x (median of 3 rounds): NOT within 5% of the reference", Judge([]float64{0.9, 0.93, 1.01}, 0.05).String())
	assert.Equal(t, "1.010x (median of 3 rounds): within 5% of the reference", Judge([]float64{0.97, 1.01, 1.02}, 0.05).String())
}
