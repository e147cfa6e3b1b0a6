package fake

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Clock is a servicelb.Clock whose time moves only by Advance. It reports
// every timer armed on it, so that a test knows what the code under test
// decided to wait for, without sleeping.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
	armed  chan time.Time
}

var _ servicelb.Clock = (*Clock)(nil)

// NewClock returns a Clock set to now.
func NewClock(now time.Time) *Clock {
	return &Clock{now: now, armed: make(chan time.Time, 1024)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires when the clock reaches now+d; at once
// if d <= 0. Its deadline is reported to NextTimer.
func (c *Clock) NewTimer(d time.Duration) servicelb.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	c.armed <- t.at
	return t
}

// Advance moves the clock forward by d and fires the timers due by then.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.now) {
			kept = append(kept, t)
			continue
		}
		t.ch <- c.now
	}
	c.timers = kept
}

// NextTimer blocks until a timer is armed that has not been reported yet,
// or ctx ends, and returns its deadline.
func (c *Clock) NextTimer(ctx context.Context) (time.Time, error) {
	select {
	case at := <-c.armed:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("waiting for a timer: %w", ctx.Err())
	}
}

type timer struct {
	c  *Clock
	at time.Time
	ch chan time.Time
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, o := range t.c.timers {
		if o == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}
