package syncer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// engineProxier is a Proxier on an Engine, as a backend is.
type engineProxier struct{ e *Engine }

func (p engineProxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	return p.e.Sync(ctx, st)
}
func (p engineProxier) Cleanup(context.Context) error        { return nil }
func (p engineProxier) Capabilities() servicelb.Capabilities { return fake.AllCapabilities() }
func (p engineProxier) Close() error                         { p.e.Close(); return nil }

// TestFullSyncsReported: a Runner driving an Engine learns which syncs
// wrote the whole state: the first and a repair, not a change applied.
func TestFullSyncsReported(t *testing.T) {
	b := newFake()
	results := make(chan servicelb.SyncResult, 10)
	r, err := servicelb.NewRunner(engineProxier{newEngine(b, nil, &clock{t: time.Unix(1000, 0)})}, servicelb.RunnerOptions{
		MinSyncInterval: time.Millisecond,
		Hooks:           servicelb.Hooks{Synced: func(res servicelb.SyncResult) { results <- res }},
	})
	require.NoError(t, err)
	src := r.Source("s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	next := func(what string) bool {
		t.Helper()
		select {
		case res := <-results:
			require.NoError(t, res.Err, what)
			return res.Full
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no sync", what)
			return false
		}
	}
	src.Synced()
	assert.True(t, next("first sync"))
	require.NoError(t, src.Upsert(udpService("10.0.0.1")))
	assert.False(t, next("a change applied"))
	b.checkOK = false
	require.NoError(t, src.Upsert(udpService("10.0.0.2")))
	assert.True(t, next("a repair"))
	assert.Equal(t, []string{"write", "check", "apply", "check", "write"}, b.take())
}
