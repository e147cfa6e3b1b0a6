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
// the idle time. The test hands the watchdog its ticks, so that a busy
// machine, which can hold any goroutine for longer than an idle time,
// changes nothing of what it sees.
func TestWatchIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ticks := make(chan time.Time)
	done := make(chan error, 1)
	go func() { done <- watchIdle(ctx, idle, ticks, n.Load) }()
	// Each tick is taken only once the watchdog has looked at the one
	// before: a tick it never takes means it stopped.
	now := time.Unix(1e9, 0)
	tick := func(d time.Duration) {
		t.Helper()
		now = now.Add(d)
		select {
		case ticks <- now:
		case err := <-done:
			t.Fatalf("stopped at %v: %v", now, err)
		}
	}
	for range 100 { // ten idle times of output, a tick each 100 ms
		n.Add(1)
		tick(100 * time.Millisecond)
	}
	tick(100 * time.Millisecond)
	tick(100 * time.Millisecond) // 200 ms without output: let run
	tick(99 * time.Millisecond)
	tick(time.Millisecond) // 300 ms: stopped, on this tick
	select {
	case err := <-done:
		require.ErrorIs(t, err, errIdle)
	case <-time.After(time.Minute):
		t.Fatal("a silent guest was not stopped")
	}

	go func() { done <- watchIdle(ctx, idle, ticks, n.Load) }()
	tick(time.Hour) // the first tick starts the count
	n.Add(1)
	tick(time.Hour)
	cancel()
	require.NoError(t, <-done, "an ended context")
}
