package consulsource

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// retryLog records the waits a source logs after failed queries.
type retryLog struct {
	mu    sync.Mutex
	waits []string
}

var retryRE = regexp.MustCompile(`msg="consul query failed" .* retry=(\S+)`)

func (r *retryLog) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimSpace(string(p)), "\n") {
		if m := retryRE.FindStringSubmatch(line); m != nil {
			r.mu.Lock()
			r.waits = append(r.waits, m[1])
			r.mu.Unlock()
		}
	}
	return len(p), nil
}

func (r *retryLog) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.waits...)
}

// A source whose Consul does not answer waits twice as long after each
// failure, up to its bound.
func TestRetryBacksOff(t *testing.T) {
	// A port nothing listens on: every query fails at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	c, err := NewClient(ClientOptions{Addr: addr})
	require.NoError(t, err)

	var log retryLog
	src := &Source{Client: c, RetryInterval: 20 * time.Millisecond, MaxRetryInterval: 80 * time.Millisecond, MinQueryInterval: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&log, nil))}
	r, err := servicelb.NewRunner(&fake.Proxier{}, servicelb.RunnerOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, r.Source("consul"), func(string, error) {}) }()
	require.Eventually(t, func() bool { return len(log.get()) >= 6 }, 5*time.Second, 10*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"20ms", "40ms", "80ms", "80ms", "80ms", "80ms"}, log.get()[:6])
}

// The backoff starts over after a success.
func TestBackoffReset(t *testing.T) {
	b := (&Source{RetryInterval: time.Second, MaxRetryInterval: 5 * time.Second}).backoff()
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}, []time.Duration{b.wait(), b.wait(), b.wait(), b.wait()})
	b.reset()
	assert.Equal(t, time.Second, b.wait())
}

// NewClient refuses half a client certificate and a CA it cannot read.
func TestNewClientErrors(t *testing.T) {
	_, err := NewClient(ClientOptions{CertFile: "c.pem"})
	assert.ErrorContains(t, err, "needs its key")
	_, err = NewClient(ClientOptions{CAFile: "/nonexistent/ca.pem"})
	assert.Error(t, err, "a CA file that cannot be read")
}

// fakeAgent is a Consul agent's HTTP API that lists web and bad: web's
// health answers one passing instance, bad's a 500. Every answer comes
// at once, with the same index, as a proxy that does not hold blocking
// queries answers. It counts the queries of each path.
type fakeAgent struct {
	mu      sync.Mutex
	queries map[string]int
}

func (f *fakeAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.queries[r.URL.Path]++
	f.mu.Unlock()
	w.Header().Set("X-Consul-Index", "7")
	switch r.URL.Path {
	case "/v1/catalog/services":
		fmt.Fprint(w, `{"web": [], "bad": []}`)
	case "/v1/health/service/web":
		fmt.Fprint(w, `[{"Node": {"Node": "n1", "Address": "10.1.0.1"},
			"Service": {"ID": "web-1", "Service": "web", "Address": "10.1.0.1", "Port": 8080},
			"Checks": [{"Status": "passing"}]}]`)
	default:
		http.Error(w, "broken", http.StatusInternalServerError)
	}
}

func (f *fakeAgent) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queries[path]
}

// One service whose health query fails is reported and left out; the
// others are programmed (the source syncs). A Consul that answers
// blocking queries at once is queried at most once per MinQueryInterval
// by each watch, never in a hot loop.
func TestFailingServiceAndEagerAgent(t *testing.T) {
	agent := &fakeAgent{queries: map[string]int{}}
	server := httptest.NewServer(agent)
	defer server.Close()
	c, err := NewClient(ClientOptions{Addr: server.URL})
	require.NoError(t, err)
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{MinSyncInterval: time.Millisecond})
	require.NoError(t, err)
	src := &Source{Client: c, RetryInterval: 10 * time.Millisecond, MinQueryInterval: 200 * time.Millisecond,
		Options: Options{Mapping: map[string]Mapping{"web": {VIP: "10.96.0.10", Port: 80}, "bad": {VIP: "10.96.0.11", Port: 80}}}}
	var mu sync.Mutex
	reported := map[string]string{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = r.Run(ctx) })
	dst := r.Source("consul")
	wg.Go(func() {
		_ = src.Run(ctx, dst, func(o string, err error) { mu.Lock(); reported[o] = err.Error(); mu.Unlock() })
	})
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	recs, err := p.WaitSyncs(wait, 1)
	require.NoError(t, err, "the source never synced")
	_, hasWeb := recs[0].State.Service("consul/web")
	assert.True(t, hasWeb)
	mu.Lock()
	assert.Contains(t, reported["consul/bad"], "health query")
	mu.Unlock()

	time.Sleep(2 * time.Second)
	for _, path := range []string{"/v1/catalog/services", "/v1/health/service/web", "/v1/health/service/bad"} {
		assert.LessOrEqual(t, agent.count(path), 15, "%s queried in a hot loop", path)
	}
}

// blockingAgent lists services svc0..svc<n-1>, each with one passing
// instance, and holds every blocking query (one with an index) for its
// wait, as Consul does when nothing changes. It records the most health
// queries in flight at once.
type blockingAgent struct {
	n              int
	mu             sync.Mutex
	inFlight, most int
}

func (b *blockingAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	health := strings.HasPrefix(r.URL.Path, "/v1/health/service/")
	if health {
		b.mu.Lock()
		b.inFlight++
		b.most = max(b.most, b.inFlight)
		b.mu.Unlock()
		defer func() { b.mu.Lock(); b.inFlight--; b.mu.Unlock() }()
	}
	if r.URL.Query().Get("index") != "" {
		wait, _ := time.ParseDuration(r.URL.Query().Get("wait"))
		select {
		case <-time.After(wait):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Consul-Index", "5")
	if !health {
		names := make([]string, b.n)
		for i := range names {
			names[i] = fmt.Sprintf(`"svc%d": []`, i)
		}
		fmt.Fprint(w, "{"+strings.Join(names, ",")+"}")
		return
	}
	name := strings.TrimPrefix(r.URL.Path, "/v1/health/service/")
	fmt.Fprintf(w, `[{"Node": {"Node": "n1", "Address": "10.1.0.1"},
		"Service": {"ID": "%s-1", "Service": "%s", "Address": "10.1.0.1", "Port": 8080, "Meta": {"kproxy-vip": "10.96.1.%s"}},
		"Checks": [{"Status": "passing"}]}]`, name, name, strings.TrimPrefix(name, "svc"))
}

func (b *blockingAgent) mostInFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.most
}

// The health queries in flight at once, each a connection to the agent,
// are at most MaxQueries: with more services, they take turns, each
// query waiting CrowdedWaitTime at most, and every service is read.
func TestQueriesBounded(t *testing.T) {
	agent := &blockingAgent{n: 12}
	server := httptest.NewServer(agent)
	defer server.Close()
	c, err := NewClient(ClientOptions{Addr: server.URL})
	require.NoError(t, err)
	p := &fake.Proxier{}
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{MinSyncInterval: time.Millisecond})
	require.NoError(t, err)
	src := &Source{Client: c, MaxQueries: 4, CrowdedWaitTime: 100 * time.Millisecond, MinQueryInterval: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = r.Run(ctx) })
	dst := r.Source("consul")
	wg.Go(func() { _ = src.Run(ctx, dst, func(o string, err error) { t.Errorf("%s: %v", o, err) }) })
	wait, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	recs, err := p.WaitSyncs(wait, 1)
	require.NoError(t, err)
	assert.Equal(t, 12, recs[0].State.Len(), "every service read")
	time.Sleep(time.Second)
	assert.LessOrEqual(t, agent.mostInFlight(), 4, "health queries in flight at once")
	assert.Equal(t, 4, agent.mostInFlight(), "the slots are used")
}
