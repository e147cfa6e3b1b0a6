package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// A sync is recorded in each family it programmed, full or partial, with
// the latency of each change it applied; a failed one records its
// duration and nothing else; kube-proxy's buckets are kept.
func TestKubeProxy(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewKubeProxy(reg, func() servicelb.Health { return servicelb.Health{} })
	h := m.Hooks()
	end := time.Now()
	cause := end.Add(-1500 * time.Millisecond)
	h.Synced(servicelb.SyncResult{Start: end.Add(-time.Millisecond), Duration: time.Millisecond, Full: true,
		Families: []servicelb.FamilySync{{Family: servicelb.IPv4, Triggered: []time.Time{cause}}, {Family: servicelb.IPv6}}})
	h.Synced(servicelb.SyncResult{Start: end, Duration: time.Millisecond, Err: assert.AnError,
		Families: []servicelb.FamilySync{{Family: servicelb.IPv4}, {Family: servicelb.IPv6}}})
	h.Changes(servicelb.ChangeStats{Services: 3, Endpoints: 2})
	h.Changes(servicelb.ChangeStats{Services: 1, Endpoints: 1}) // older: never back
	m.ProxyAnswered("/healthz", 200)

	count := func(name string) float64 {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		return float64(n)
	}
	assert.Equal(t, 2.0, count("kubeproxy_sync_full_proxy_rules_duration_seconds"), "one series per family")
	assert.Equal(t, 2.0, count("kubeproxy_sync_partial_proxy_rules_duration_seconds"))
	assert.Equal(t, 1.0, count("kubeproxy_network_programming_duration_seconds"), "only IPv4 had a change")
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP kubeproxy_sync_proxy_rules_service_changes_total Cumulative proxy rules Service changes
# TYPE kubeproxy_sync_proxy_rules_service_changes_total counter
kubeproxy_sync_proxy_rules_service_changes_total 3
# HELP kubeproxy_proxy_healthz_total Cumulative proxy healthz HTTP status
# TYPE kubeproxy_proxy_healthz_total counter
kubeproxy_proxy_healthz_total{code="200"} 1
`), "kubeproxy_sync_proxy_rules_service_changes_total", "kubeproxy_proxy_healthz_total"))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "kubeproxy_network_programming_duration_seconds" {
			hist := mf.GetMetric()[0].GetHistogram()
			assert.Len(t, hist.GetBucket(), 81, "kube-proxy's buckets")
			assert.Equal(t, uint64(1), hist.GetSampleCount())
			assert.InDelta(t, 1.5, hist.GetSampleSum(), 0.01)
		}
		if mf.GetName() == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" {
			assert.Len(t, mf.GetMetric(), 2, "a success in each family")
		}
	}
}

// Counts of changes that arrive late are ignored, so that the counters
// never go back.
func TestChangeCountersNeverGoBack(t *testing.T) {
	m := NewKubeProxy(prometheus.NewRegistry(), func() servicelb.Health { return servicelb.Health{} })
	m.Changed(servicelb.ChangeStats{Services: 3, Endpoints: 5, ServicesPending: 1})
	m.Changed(servicelb.ChangeStats{Services: 2, Endpoints: 5})
	assert.Equal(t, servicelb.ChangeStats{Services: 3, Endpoints: 5, ServicesPending: 1}, m.changes)
	m.Changed(servicelb.ChangeStats{Services: 3, Endpoints: 5})
	assert.Equal(t, servicelb.ChangeStats{Services: 3, Endpoints: 5}, m.changes)
}
