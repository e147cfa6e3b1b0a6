package consulsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Source follows Consul's catalog and each service's health with blocking
// queries and feeds the translations to a runner.
type Source struct {
	Client *api.Client
	Options
	// WaitTime bounds each blocking query; default 5 minutes.
	WaitTime time.Duration
	// RetryInterval is the wait after a failed query; default 1 s. Each
	// further failure of the same query doubles it, up to MaxRetryInterval
	// (default 30 s); a success starts over.
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
	// MinQueryInterval is the least time between the starts of two
	// queries of one watch; default 1 s. A blocking query that Consul (or
	// a proxy between) answers at once, with the index unchanged or reset,
	// is then never repeated in a hot loop.
	MinQueryInterval time.Duration
	// MaxQueries bounds the health queries in flight at once, each a
	// connection to the agent, which refuses more than its
	// limits.http_max_conns_per_client (200) from one address; default
	// 100. With more services than that, the services take turns: each
	// blocking query waits at most CrowdedWaitTime (default 10 s), so that
	// a service's change is seen within about CrowdedWaitTime times the
	// services per query.
	MaxQueries      int
	CrowdedWaitTime time.Duration
	// Logger receives query failures and skipped services; nil discards.
	Logger *slog.Logger

	dst    *servicelb.Source
	report agent.Reporter
	slots  chan struct{} // one per health query in flight

	mu       sync.Mutex
	watchers map[string]context.CancelFunc
	waiting  map[string]bool   // services whose first answer is pending
	invalid  map[string]string // services reported invalid, by error text
	synced   bool
	listed   bool
}

var _ agent.Source = (*Source)(nil)

// Name returns "consul".
func (s *Source) Name() string { return "consul" }

// Run follows the catalog until ctx ends. The source is synced once the
// catalog and every service in it have answered once.
func (s *Source) Run(ctx context.Context, dst *servicelb.Source, report agent.Reporter) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.WaitTime == 0 {
		s.WaitTime = 5 * time.Minute
	}
	if s.RetryInterval == 0 {
		s.RetryInterval = time.Second
	}
	if s.MaxRetryInterval == 0 {
		s.MaxRetryInterval = 30 * time.Second
	}
	if s.MinQueryInterval == 0 {
		s.MinQueryInterval = time.Second
	}
	if s.MaxQueries <= 0 {
		s.MaxQueries = 100
	}
	if s.CrowdedWaitTime <= 0 {
		s.CrowdedWaitTime = 10 * time.Second
	}
	s.slots = make(chan struct{}, s.MaxQueries)
	s.dst, s.report = dst, report
	s.watchers, s.waiting, s.invalid = map[string]context.CancelFunc{}, map[string]bool{}, map[string]string{}
	var wg sync.WaitGroup
	defer wg.Wait()
	var index uint64
	b := s.backoff()
	var last time.Time
	for ctx.Err() == nil {
		s.pace(ctx, &last)
		opts := (&api.QueryOptions{WaitIndex: index, WaitTime: s.WaitTime}).WithContext(ctx)
		names, meta, err := s.Client.Catalog().Services(opts)
		if err != nil {
			s.retry(ctx, "catalog", err, &b)
			continue
		}
		b.reset()
		index = nextIndex(index, meta.LastIndex)
		s.follow(ctx, &wg, names)
	}
	return nil
}

// pace waits until MinQueryInterval has passed since *last, the start of
// the previous query, and sets *last to now.
func (s *Source) pace(ctx context.Context, last *time.Time) {
	if wait := s.MinQueryInterval - time.Since(*last); !last.IsZero() && wait > 0 {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	*last = time.Now()
}

// nextIndex applies Consul's rules for blocking query indexes: start over
// when the index goes backwards, and never wait on 0.
func nextIndex(prev, last uint64) uint64 {
	if last < prev || last == 0 {
		return 0
	}
	return last
}

// backoff is the wait before a failed query is tried again: doubled by
// each failure, up to a bound, and reset by a success.
type backoff struct {
	first, max, next time.Duration
}

func (s *Source) backoff() backoff {
	return backoff{first: s.RetryInterval, max: s.MaxRetryInterval, next: s.RetryInterval}
}

func (b *backoff) reset() { b.next = b.first }

// wait returns the wait before the next try and doubles the one after.
func (b *backoff) wait() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

func (s *Source) retry(ctx context.Context, what string, err error, b *backoff) {
	if ctx.Err() != nil {
		return
	}
	d := b.wait()
	s.Logger.Warn("consul query failed", "query", what, "err", err, "retry", d)
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// follow starts a watcher for each new service and stops those gone.
func (s *Source) follow(ctx context.Context, wg *sync.WaitGroup, names map[string][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, cancel := range s.watchers {
		if _, ok := names[name]; !ok {
			cancel()
			delete(s.watchers, name)
			delete(s.waiting, name)
			s.remove(name)
		}
	}
	for name := range names {
		if _, ok := s.watchers[name]; ok {
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		s.watchers[name] = cancel
		s.waiting[name] = true
		wg.Go(func() { s.watch(wctx, name) })
	}
	s.listed = true
	s.checkSynced()
}

// watch follows one service's health until ctx ends. A query that fails
// is reported, and tried again; a service whose first query failed is
// left out (a later failure keeps its last good version), so that one
// service Consul does not answer for never holds back the others.
func (s *Source) watch(ctx context.Context, name string) {
	var index uint64
	var last time.Time
	b := s.backoff()
	for ctx.Err() == nil {
		s.pace(ctx, &last)
		entries, meta, err := s.query(ctx, name, index)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.mu.Lock()
			s.reportOnce(name, fmt.Errorf("health query: %w", err))
			delete(s.waiting, name)
			s.checkSynced()
			s.mu.Unlock()
			s.retry(ctx, "health "+name, err, &b)
			continue
		}
		b.reset()
		index = nextIndex(index, meta.LastIndex)
		s.mu.Lock()
		if ctx.Err() == nil {
			s.apply(name, entries)
			delete(s.waiting, name)
			s.checkSynced()
		}
		s.mu.Unlock()
	}
}

// query runs one blocking health query of a service in one of the slots,
// waiting for one first.
func (s *Source) query(ctx context.Context, name string, index uint64) ([]*api.ServiceEntry, *api.QueryMeta, error) {
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	defer func() { <-s.slots }()
	wait := s.WaitTime
	s.mu.Lock()
	if len(s.watchers) > s.MaxQueries {
		wait = min(wait, s.CrowdedWaitTime)
	}
	s.mu.Unlock()
	opts := (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx)
	return s.Client.Health().Service(name, "", false, opts)
}

// apply translates and upserts a service; s.mu is held.
func (s *Source) apply(name string, entries []*api.ServiceEntry) {
	if len(entries) == 0 {
		s.remove(name)
		return
	}
	svc, err := Translate(name, entries, s.Options)
	if errors.Is(err, ErrNoVIP) {
		s.Logger.Debug("service not load-balanced", "service", name, "reason", err)
		s.remove(name)
		return
	}
	if err == nil {
		err = s.dst.Upsert(svc)
	}
	if err != nil {
		s.reportOnce(name, err)
		return
	}
	delete(s.invalid, name)
}

// reportOnce reports a service's error unless it was the last reported;
// s.mu is held.
func (s *Source) reportOnce(name string, err error) {
	if s.invalid[name] != err.Error() {
		s.invalid[name] = err.Error()
		s.report(NamePrefix+name, err)
	}
}

// remove deletes a service; s.mu is held.
func (s *Source) remove(name string) {
	delete(s.invalid, name)
	if err := s.dst.Delete(NamePrefix + name); err != nil {
		s.report(NamePrefix+name, err)
	}
}

// checkSynced reports the source synced once everything answered; s.mu is
// held.
func (s *Source) checkSynced() {
	if !s.synced && s.listed && len(s.waiting) == 0 {
		s.synced = true
		s.dst.Synced()
		s.Logger.Info("consul catalog synced", "services", len(s.watchers))
	}
}
