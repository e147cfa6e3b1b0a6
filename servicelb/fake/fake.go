// Package fake provides test aids for code that drives a servicelb.Proxier:
// a Proxier that records what it is asked to apply, and a Clock whose time
// moves only when told.
package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Record is one call to Proxier.Sync.
type Record struct {
	// State is what the proxier was asked to apply.
	State *servicelb.State
	// Changes is the difference from the state last applied successfully
	// to the one applied (or tried).
	Changes servicelb.Changes
	// Report and Err are what Sync returned.
	Report servicelb.SyncReport
	Err    error
}

// Proxier is a servicelb.Proxier that touches no kernel: it records every
// Sync and can be told to fail. The zero value is ready to use, and
// declares every capability (AllCapabilities).
type Proxier struct {
	// Caps, when its Backend is set, are the capabilities the proxier
	// declares instead of AllCapabilities.
	Caps servicelb.Capabilities

	mu       sync.Mutex
	records  []Record
	applied  *servicelb.State
	failures []error
	cleanups int
	closed   bool
	changed  chan struct{}
}

var _ servicelb.Proxier = (*Proxier)(nil)
var _ servicelb.Renderer = (*Proxier)(nil)

// Sync records st and returns the next error queued by FailNext, if any.
// As a real backend, it reports a sync full when there is no state
// applied before it or the node changed, and leaves out the services an
// error queued names (servicelb.ServicesOf), applying the rest.
func (p *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return servicelb.SyncReport{}, fmt.Errorf("fake: sync: %w", servicelb.ErrClosed)
	}
	rec := Record{State: st}
	var err error
	if err = ctx.Err(); err == nil && len(p.failures) > 0 {
		err, p.failures = p.failures[0], p.failures[1:]
	}
	applied := st
	if out := servicelb.ServicesOf(err); out != nil {
		applied = st.Without(slices.Collect(maps.Keys(out))...)
		rec.Report.LeftOut, err = out, nil
	}
	rec.Changes = servicelb.Diff(p.applied, applied)
	rec.Report.Full = rec.Changes.NodeChanged
	if err == nil {
		p.applied, rec.Report.Applied = applied, applied
	}
	rec.Err = err
	p.records = append(p.records, rec)
	p.notify()
	return rec.Report, rec.Err
}

// AllCapabilities are the capabilities of a Proxier without Caps: every
// scheduler hint, protocol and feature, and no bound on endpoints.
func AllCapabilities() servicelb.Capabilities {
	return servicelb.Capabilities{Backend: "fake", Schedulers: servicelb.Schedulers(), Features: servicelb.AllFeatures}
}

// Capabilities returns Caps, or AllCapabilities.
func (p *Proxier) Capabilities() servicelb.Capabilities {
	if p.Caps.Backend != "" {
		return p.Caps
	}
	return AllCapabilities()
}

// Cleanup forgets the applied state.
func (p *Proxier) Cleanup(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("fake: cleanup: %w", servicelb.ErrClosed)
	}
	p.applied = nil
	p.cleanups++
	p.notify()
	return nil
}

// Close makes later Sync and Cleanup calls return servicelb.ErrClosed;
// the state applied stays.
func (p *Proxier) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

func (p *Proxier) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// FailNext makes the next Sync calls return errs, one each. An error that
// names services alone (servicelb.ServicesOf: *servicelb.ValidationErrors
// naming them) is not returned: the Sync leaves those services out and
// applies the rest, as a backend does with services it cannot hold.
func (p *Proxier) FailNext(errs ...error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failures = append(p.failures, errs...)
}

// Records returns every Sync call so far.
func (p *Proxier) Records() []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Record(nil), p.records...)
}

// Applied returns the last state applied successfully, or nil.
func (p *Proxier) Applied() *servicelb.State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied
}

// Cleanups returns how many times Cleanup was called.
func (p *Proxier) Cleanups() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cleanups
}

// WaitSyncs blocks until Sync has been called at least n times in all, or
// ctx ends, and returns the records.
func (p *Proxier) WaitSyncs(ctx context.Context, n int) ([]Record, error) {
	for {
		p.mu.Lock()
		if len(p.records) >= n {
			out := append([]Record(nil), p.records...)
			p.mu.Unlock()
			return out, nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d syncs: %w", n, ctx.Err())
		}
	}
}

// Render lists st's service ports with their addresses and backends, one
// per line, in key order.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	var b strings.Builder
	for _, sp := range st.Ports() {
		fmt.Fprintf(&b, "%s %s", sp.Key, sp.Port.Protocol.Lower())
		if sp.ClusterIP.IsValid() {
			fmt.Fprintf(&b, " %s:%d", sp.ClusterIP, sp.Port.Port)
		}
		if sp.Port.NodePort != 0 {
			fmt.Fprintf(&b, " nodePort=%d", sp.Port.NodePort)
		}
		b.WriteString(" ->")
		bs := sp.Backends()
		if len(bs) == 0 {
			fmt.Fprintf(&b, " (%s)", sp.Internal[servicelb.FromOutside].Action)
		}
		for _, be := range bs {
			fmt.Fprintf(&b, " %s", be)
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}
