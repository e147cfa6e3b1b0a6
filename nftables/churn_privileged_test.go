//go:build privileged

package nftables_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
)

// TestForeignWriter: another program commits to nf_tables a hundred times
// a second in the same namespace; every Sync succeeds (a sync that loses
// a race is retried within it) and the table ends as a fresh apply of the
// last state would leave it.
func TestForeignWriter(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "churn")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true, VerifyInterval: 50 * time.Millisecond})
	commits := h.Churn(t, 10*time.Millisecond)
	// A hundred changes at least, and more while the other writer has
	// committed fewer than fifty times: each of its commits starts the
	// nft tool, which a busy machine slows.
	syncsBeside(t, p, commits, 50, 100, 20*time.Millisecond)
}

// syncsBeside makes rounds of n one-endpoint changes to 300 services of
// 10 endpoints, a Sync each every apart, until another writer has
// committed atLeast times (or two minutes passed), and requires every
// Sync to succeed and the writer to have committed that often.
func syncsBeside(t *testing.T, p *nftables.Proxier, commits func() int, atLeast, n int, every time.Duration) {
	t.Helper()
	svcs := servicetest.Scale(300, 10)
	failed, rounds := 0, 0
	for deadline := time.Now().Add(2 * time.Minute); rounds == 0 || commits() < atLeast && time.Now().Before(deadline); rounds++ {
		failed += servicetest.SyncChanges(t, p, servicetest.ScaleNode(), svcs, n, every)
	}
	require.Zero(t, failed, "Syncs failed while another writer committed %d times", commits())
	require.GreaterOrEqual(t, commits(), atLeast, "the other writer hardly ran in %d rounds of changes", rounds)
}

// BenchmarkForeignWriter loads 5,000 services of 10 endpoints
// (KPROXY_CHURN_SERVICES for another number) while another program
// commits to nf_tables ten times a second in the namespace, then makes 200
// one-endpoint changes, one Sync each, and reports the share of Syncs that
// succeeded at once, as a Runner's first attempt.
func BenchmarkForeignWriter(b *testing.B) {
	netnstest.Require(b, "nf_tables", "nat")
	n := 5000
	if v, err := strconv.Atoi(os.Getenv("KPROXY_CHURN_SERVICES")); err == nil && v > 0 {
		n = v
	}
	const syncs = 200
	for b.Loop() {
		h := netnstest.NewHost(b, "churnbench")
		p := newProxier(b, h, nftables.Options{NoConntrackCleanup: true})
		commits := h.Churn(b, 100*time.Millisecond)
		failed := servicetest.SyncChanges(b, p, servicetest.ScaleNode(), servicetest.Scale(n, 10), syncs, 50*time.Millisecond)
		b.ReportMetric(100*float64(syncs-failed)/syncs, "sync-success-%")
		b.ReportMetric(float64(commits()), "foreign-commits")
	}
}

// TestForeignFlood is TestForeignWriter against a writer that commits
// thousands of times a second: a sync that has checked the table must not
// then lose its commit to a foreign one, however often they come.
func TestForeignFlood(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "flood")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true, VerifyInterval: 50 * time.Millisecond})
	syncsBeside(t, p, h.Flood(t, 50*time.Microsecond), 2000, 50, 0)
}
