//go:build linux

package vmtest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWatchIdle: a guest whose output keeps growing is let run, however
// long; one whose output stops is stopped once it has written nothing for
// the idle time.
func TestWatchIdle(t *testing.T) {
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watchIdle(ctx, 300*time.Millisecond, 10*time.Millisecond, n.Load) }()
	for range 240 { // 1.2 s of output, four times the idle time
		n.Add(1)
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("a guest writing output was stopped: %v", err)
	default:
	}
	start := time.Now()
	select {
	case err := <-done:
		require.ErrorIs(t, err, errIdle)
		require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("a silent guest was not stopped")
	}
	cancel()
	require.NoError(t, watchIdle(ctx, time.Hour, time.Millisecond, n.Load), "an ended context")
}
