//go:build linux

package netnstest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Repeated is a function called over and over, without pause, in a
// goroutine of its own: traffic kept going across a change (a restart, an
// upgrade), to show that none of it fails.
type Repeated struct {
	runs     atomic.Int64
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	failures []error
}

// Repeat calls f over and over until Stop, or until the test ends, and
// keeps the errors it returns.
func Repeat(t testing.TB, f func() error) *Repeated {
	r := &Repeated{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			err := f()
			if err != nil {
				r.mu.Lock()
				r.failures = append(r.failures, err)
				r.mu.Unlock()
			}
			r.runs.Add(1)
		}
	}()
	t.Cleanup(func() { r.Stop() })
	return r
}

// Runs returns the number of calls that have returned so far.
func (r *Repeated) Runs() int64 { return r.runs.Load() }

// Stop ends the calls, waits for the last one, and returns the errors of
// them all.
func (r *Repeated) Stop() []error {
	r.once.Do(func() { close(r.stop) })
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failures
}

// ServeConns accepts connections on ln until it is closed, and handles
// each in a goroutine of its own: a test's server in a few lines. The
// caller closes ln (and its handlers their connections).
func ServeConns(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}
