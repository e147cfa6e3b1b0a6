package agent

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// kubeProxyMetrics are kube-proxy's metrics under their own names, types
// and buckets (kube-proxy's pkg/proxy/metrics), so that its dashboards and
// alerts work unchanged.
type kubeProxyMetrics struct {
	syncDuration, fullSync, partialSync prometheus.Histogram
	lastSync                            prometheus.Gauge
	programming                         prometheus.Histogram
	noLocal                             *prometheus.GaugeVec

	mu      sync.Mutex
	changes servicelb.ChangeStats
	// applied is the last state applied, noLocal's counts of it by
	// traffic policy.
	applied            *servicelb.State
	internal, external int
}

// syncBuckets are kube-proxy's buckets for sync durations: 1 ms to 16 s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's buckets for the network programming
// latency: 0, 0.25 s, 0.5 s, then every second to 59 s, every 5 s to
// 115 s, every 30 s to 5 min.
var programmingBuckets = mergeBuckets(
	prometheus.LinearBuckets(0.25, 0.25, 2),
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

func mergeBuckets(bs ...[]float64) []float64 {
	out := []float64{0}
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

func newKubeProxyMetrics(reg *prometheus.Registry) *kubeProxyMetrics {
	const ns = "kubeproxy"
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets})
	}
	m := &kubeProxyMetrics{
		syncDuration: histogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets),
		fullSync:     histogram("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets),
		partialSync:  histogram("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}),
		programming: histogram("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", programmingBuckets),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy"}),
	}
	stat := func(f func(servicelb.ChangeStats) float64) func() float64 {
		return func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			return f(m.changes)
		}
	}
	reg.MustRegister(m.syncDuration, m.fullSync, m.partialSync, m.lastSync, m.programming, m.noLocal,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.EndpointsPending) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.Endpoints) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.ServicesPending) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.Services) })),
	)
	for _, p := range []string{"internal", "external"} {
		m.noLocal.WithLabelValues(p).Set(0)
	}
	return m
}

// synced records a sync attempt: its duration, full or partial, and for a
// success its end and the latency of each change it applied.
func (m *kubeProxyMetrics) synced(r servicelb.SyncResult) {
	d := r.Duration.Seconds()
	m.syncDuration.Observe(d)
	if r.Full {
		m.fullSync.Observe(d)
	} else {
		m.partialSync.Observe(d)
	}
	if r.Err != nil {
		return
	}
	m.lastSync.Set(unixSeconds(r.End()))
	for _, t := range r.Triggered {
		m.programming.Observe(r.End().Sub(t).Seconds())
	}
}

// changed records the counts of changes, unless they are older than
// those recorded: a counter must never go back.
func (m *kubeProxyMetrics) changed(s servicelb.ChangeStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Services < m.changes.Services || s.Endpoints < m.changes.Endpoints {
		return
	}
	m.changes = s
}

// stateApplied counts, in the cost of what changed, the service ports that
// drop traffic of a Local policy for want of a local endpoint, by policy:
// those whose cluster IP drops (internal), and those whose node ports,
// external and load-balancer IPs drop traffic from outside (external).
func (m *kubeProxyMetrics) stateApplied(st *servicelb.State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := servicelb.Diff(m.applied, st)
	count := func(sp *servicelb.ServicePort, d int) {
		if sp.ClusterIP.IsValid() && sp.Internal.Of(servicelb.FromOutside).Action == servicelb.Drop {
			m.internal += d
		}
		if sp.ExternallyAccessible() && sp.External.Of(servicelb.FromOutside).Action == servicelb.Drop {
			m.external += d
		}
	}
	for _, sp := range ch.Removed {
		count(sp, -1)
	}
	for _, sp := range ch.Added {
		count(sp, 1)
	}
	for _, c := range ch.Changed {
		count(c.Old, -1)
		count(c.New, 1)
	}
	m.applied = st
	m.noLocal.WithLabelValues("internal").Set(float64(m.internal))
	m.noLocal.WithLabelValues("external").Set(float64(m.external))
}
