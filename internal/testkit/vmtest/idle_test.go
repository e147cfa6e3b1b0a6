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
	// The watchdog reads the count once as it starts and once a tick; the
	// test goes on only once it has, so that the count it reads at a tick
	// is the one the test set before that tick.
	looked := make(chan struct{})
	progress := func() int64 {
		v := n.Load()
		looked <- struct{}{}
		return v
	}
	watch := func() {
		go func() { done <- watchIdle(ctx, idle, ticks, progress) }()
		<-looked
	}
	watch()
	// A tick the watchdog never takes means it stopped.
	now := time.Unix(1e9, 0)
	tick := func(d time.Duration) {
		t.Helper()
		now = now.Add(d)
		select {
		case ticks <- now:
		case err := <-done:
			t.Fatalf("stopped before %v: %v", now, err)
		}
		<-looked
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

	watch()
	tick(time.Hour) // the first tick starts the count
	n.Add(1)
	tick(time.Hour)
	cancel()
	require.NoError(t, <-done, "an ended context")
}
