package agent

import (
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kproxy-dev/kproxy/kube/metrics"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Metrics are an agent's Prometheus metrics: kube-proxy's under their
// own names (kubeproxy_...), and kproxy's, named as kube-proxy's under
// the kproxy namespace. They live in their own registry.
type Metrics struct {
	Registry *prometheus.Registry
	kube     *metrics.KubeProxy

	syncDuration   prometheus.Histogram
	programming    prometheus.Histogram
	lastSync       prometheus.Gauge
	syncFailures   prometheus.Counter
	serviceChanges prometheus.Counter
	pending        prometheus.Gauge
	invalid        *prometheus.CounterVec
}

// NewMetrics registers the metrics; health reports the runner's state for
// the queued-change gauge.
func NewMetrics(backend string, health func() servicelb.Health) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.001, 2, 15)
	labels := prometheus.Labels{"backend": backend}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kproxy", Name: "sync_proxy_rules_duration_seconds", ConstLabels: labels,
			Help: "How long a sync of the rules to the kernel took.", Buckets: buckets,
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kproxy", Name: "network_programming_duration_seconds", ConstLabels: labels,
			Help:    "Time from a service or endpoint change arriving to its rules being in the kernel.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kproxy", Name: "sync_proxy_rules_last_timestamp_seconds", ConstLabels: labels,
			Help: "When the last successful sync finished (Unix seconds).",
		}),
		syncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kproxy", Name: "sync_proxy_rules_failures_total", ConstLabels: labels,
			Help: "Syncs that failed.",
		}),
		serviceChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kproxy", Name: "sync_proxy_rules_service_changes_total", ConstLabels: labels,
			Help: "Service changes applied by successful syncs.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kproxy", Name: "sync_proxy_rules_service_changes_pending", ConstLabels: labels,
			Help: "Services changed and not yet applied.",
		}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kproxy", Name: "invalid_objects_total",
			Help: "Objects from a source that were rejected as invalid and skipped.",
		}, []string{"source"}),
	}
	queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "kproxy", Name: "sync_proxy_rules_last_queued_timestamp_seconds", ConstLabels: labels,
		Help: "When the oldest change not yet applied arrived (Unix seconds); 0 when none waits.",
	}, func() float64 { return unixSeconds(health().QueuedAt) })
	m.Registry.MustRegister(m.syncDuration, m.programming, m.lastSync, m.syncFailures,
		m.serviceChanges, m.pending, m.invalid, queued,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.kube = metrics.NewKubeProxy(m.Registry, health)
	return m
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// Hooks returns the runner hooks that feed the metrics.
func (m *Metrics) Hooks() servicelb.Hooks {
	return servicelb.Hooks{
		Synced: func(r servicelb.SyncResult) {
			m.kube.Synced(r)
			m.syncDuration.Observe(r.Duration.Seconds())
			if r.Err != nil {
				m.syncFailures.Inc()
				return
			}
			m.lastSync.Set(unixSeconds(r.End()))
			m.serviceChanges.Add(float64(r.Services))
			if !r.QueuedAt.IsZero() {
				m.programming.Observe(r.End().Sub(r.QueuedAt).Seconds())
			}
		},
		Pending: func(n int) { m.pending.Set(float64(n)) },
		Changes: m.kube.Changed,
		Applied: m.kube.StateApplied,
	}
}

// ProxyAnswered counts an answer of the proxy's health server (see
// healthcheck.ProxyOptions.Answered).
func (m *Metrics) ProxyAnswered(path string, code int) { m.kube.ProxyAnswered(path, code) }

// Invalid counts an object a source rejected.
func (m *Metrics) Invalid(source string) { m.invalid.WithLabelValues(source).Inc() }

// Handler serves /metrics; /healthz: 200 while the runner is ready and no
// change has waited longer than timeout, else 503; and /proxyMode: the
// backend (kube-proxy's mode there, which tools and Kubernetes' own tests
// read).
func Handler(m *Metrics, mode string, health func() servicelb.Health, timeout time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, mode)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := health()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !h.Healthy(time.Now(), timeout) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		last := "none"
		if !h.AppliedAt.IsZero() {
			last = h.AppliedAt.UTC().Format(time.RFC3339Nano)
		}
		fmt.Fprintf(w, "ready=%t pending=%d lastApplied=%s", h.Ready, h.Pending, last)
		if h.LastError != nil {
			fmt.Fprintf(w, " lastError=%q", h.LastError.Error())
		}
		fmt.Fprintln(w)
	})
	return mux
}

// withProfiling serves Go's profiles under /debug/pprof/ beside h, as
// kube-proxy's enableProfiling does on its metrics address.
func withProfiling(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
