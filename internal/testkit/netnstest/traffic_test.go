//go:build linux

package netnstest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRepeat: the function runs over and over until Stop, which returns
// the errors of every run and may be called again.
func TestRepeat(t *testing.T) {
	var calls atomic.Int64
	odd := errors.New("odd")
	r := Repeat(t, func() error {
		if calls.Add(1)%2 == 1 {
			return odd
		}
		return nil
	})
	require.Eventually(t, func() bool { return r.Runs() >= 10 }, 5*time.Second, time.Millisecond)
	failures := r.Stop()
	n := calls.Load()
	assert.Equal(t, n, r.Runs(), "runs counted")
	assert.Len(t, failures, int((n+1)/2), "the errors of the odd runs")
	for _, err := range failures {
		assert.ErrorIs(t, err, odd)
	}
	assert.Equal(t, failures, r.Stop(), "a second Stop")
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, n, calls.Load(), "calls after Stop")
}
