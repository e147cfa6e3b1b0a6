package consulsource

import (
	"context"
	"log/slog"
	"net"
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
	src := &Source{Client: c, RetryInterval: 20 * time.Millisecond, MaxRetryInterval: 80 * time.Millisecond,
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
