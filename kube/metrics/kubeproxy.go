// Package metrics serves kube-proxy's Prometheus metrics from a
// servicelb.Runner: kube-proxy's names, types, buckets and labels
// (kube-proxy's pkg/proxy/metrics), so that its dashboards and alerts
// work unchanged on a node proxy built on kproxy. KubeProxy registers
// them; its Hooks feed them from the Runner, and ProxyAnswered from the
// proxy's health server (healthcheck.ProxyOptions.Answered).
package metrics

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// KubeProxy are kube-proxy's metrics under their own names, types,
// buckets and labels (kube-proxy's pkg/proxy/metrics), so that its
// dashboards and alerts work unchanged. kube-proxy runs a proxier per
// address family and labels what each does with its ip_family ("IPv4",
// "IPv6"); a kproxy sync programs every family of the backend, so each
// sync counts in each of them, and each change in the families it touched
// (servicelb.SyncResult.Families).
type KubeProxy struct {
	syncDuration, fullSync, partialSync *prometheus.HistogramVec
	lastSync                            *prometheus.GaugeVec
	programming                         *prometheus.HistogramVec
	noLocal                             *prometheus.GaugeVec
	healthz, livez                      *prometheus.CounterVec

	mu      sync.Mutex
	changes servicelb.ChangeStats
	// applied is the last state applied, noLocalCount's counts of it.
	applied      *servicelb.State
	noLocalCount map[noLocalKey]int
}

// noLocalKey is a series of kubeproxy_sync_proxy_rules_no_local_endpoints_total.
type noLocalKey struct {
	policy string // "internal" or "external"
	family servicelb.Family
}

// ipFamily is kube-proxy's label of a proxier's address family.
const ipFamily = "ip_family"

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

// NewKubeProxy registers kube-proxy's metrics on reg; health reports the
// runner's state (servicelb.Runner.Health) for the time the last change
// of each family was queued.
func NewKubeProxy(reg prometheus.Registerer, health func() servicelb.Health) *KubeProxy {
	const ns = "kubeproxy"
	histogram := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: name, Help: help, Buckets: buckets}, []string{ipFamily})
	}
	m := &KubeProxy{
		syncDuration: histogram("sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", syncBuckets),
		fullSync:     histogram("sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs", syncBuckets),
		partialSync:  histogram("sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs", syncBuckets),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_last_timestamp_seconds",
			Help: "The last time proxy rules were successfully synced"}, []string{ipFamily}),
		programming: histogram("network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds", programmingBuckets),
		noLocal: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_no_local_endpoints_total",
			Help: "Number of services with a Local traffic policy and no endpoints"}, []string{"traffic_policy", ipFamily}),
		healthz: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "proxy_healthz_total",
			Help: "Cumulative proxy healthz HTTP status"}, []string{"code"}),
		livez: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "proxy_livez_total",
			Help: "Cumulative proxy livez HTTP status"}, []string{"code"}),
		noLocalCount: map[noLocalKey]int{},
	}
	stat := func(f func(servicelb.ChangeStats) float64) func() float64 {
		return func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			return f(m.changes)
		}
	}
	reg.MustRegister(m.syncDuration, m.fullSync, m.partialSync, m.lastSync, m.programming, m.noLocal, m.healthz, m.livez,
		lastQueued{health: health, desc: prometheus.NewDesc(ns+"_sync_proxy_rules_last_queued_timestamp_seconds",
			"The last time a sync of proxy rules was queued", []string{ipFamily}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_pending",
			Help: "Pending proxy rules Endpoint changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.EndpointsPending) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "sync_proxy_rules_endpoint_changes_total",
			Help: "Cumulative proxy rules Endpoint changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.Endpoints) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "sync_proxy_rules_service_changes_pending",
			Help: "Pending proxy rules Service changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.ServicesPending) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "sync_proxy_rules_service_changes_total",
			Help: "Cumulative proxy rules Service changes"}, stat(func(s servicelb.ChangeStats) float64 { return float64(s.Services) })),
	)
	return m
}

// lastQueued is kube-proxy's sync_proxy_rules_last_queued_timestamp_seconds:
// for each family, when a change of it was last queued (0 before any).
type lastQueued struct {
	desc   *prometheus.Desc
	health func() servicelb.Health
}

func (c lastQueued) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c lastQueued) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.health().Families {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, unixSeconds(f.LastQueuedAt), f.Family.Name())
	}
}

// Synced records a sync attempt (servicelb.Hooks.Synced) in each family it programmed: its
// duration, full or partial, and for a success its end, the latency of
// each change it applied in the family, and the family's services with
// no local endpoint for their Local policy.
func (m *KubeProxy) Synced(r servicelb.SyncResult) {
	d := r.Duration.Seconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, fs := range r.Families {
		family := fs.Family.Name()
		m.syncDuration.WithLabelValues(family).Observe(d)
		if r.Full {
			m.fullSync.WithLabelValues(family).Observe(d)
		} else {
			m.partialSync.WithLabelValues(family).Observe(d)
		}
		if r.Err != nil {
			continue
		}
		m.lastSync.WithLabelValues(family).Set(unixSeconds(r.End()))
		for _, t := range fs.Triggered {
			m.programming.WithLabelValues(family).Observe(r.End().Sub(t).Seconds())
		}
		for _, policy := range []string{"internal", "external"} {
			m.noLocal.WithLabelValues(policy, family).Set(float64(m.noLocalCount[noLocalKey{policy, fs.Family}]))
		}
	}
}

// Changed records the counts of changes (servicelb.Hooks.Changes), unless they are older than
// those recorded: a counter must never go back.
func (m *KubeProxy) Changed(s servicelb.ChangeStats) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Services < m.changes.Services || s.Endpoints < m.changes.Endpoints {
		return
	}
	m.changes = s
}

// StateApplied (servicelb.Hooks.Applied) counts, in the cost of what changed, the service ports that
// drop traffic of a Local policy for want of a local endpoint, by policy
// and family: those whose cluster IP drops (internal), and those whose
// node ports, external and load-balancer IPs drop traffic from outside
// (external). The next Synced publishes the counts.
func (m *KubeProxy) StateApplied(st *servicelb.State) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := servicelb.Diff(m.applied, st)
	count := func(sp *servicelb.ServicePort, d int) {
		if sp.ClusterIP.IsValid() && sp.Internal.Of(servicelb.FromOutside).Action == servicelb.Drop {
			m.noLocalCount[noLocalKey{"internal", sp.Family}] += d
		}
		if sp.ExternallyAccessible() && sp.External.Of(servicelb.FromOutside).Action == servicelb.Drop {
			m.noLocalCount[noLocalKey{"external", sp.Family}] += d
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
}

// ProxyAnswered counts an answer of the proxy's /healthz or /livez by its
// status code, as kube-proxy's proxy_healthz_total and proxy_livez_total.
func (m *KubeProxy) ProxyAnswered(path string, code int) {
	switch path {
	case "/healthz":
		m.healthz.WithLabelValues(strconv.Itoa(code)).Inc()
	case "/livez":
		m.livez.WithLabelValues(strconv.Itoa(code)).Inc()
	}
}

// Hooks returns the runner hooks that feed the metrics; a program that
// has hooks of its own calls Synced, Changed and StateApplied from them.
func (m *KubeProxy) Hooks() servicelb.Hooks {
	return servicelb.Hooks{Synced: m.Synced, Changes: m.Changed, Applied: m.StateApplied}
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}
