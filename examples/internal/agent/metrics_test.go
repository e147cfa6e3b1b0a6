package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// freeAddr returns a loopback address with a free TCP port.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// exposition is a scrape of Prometheus text: each metric family's type,
// and each sample's value by its line's name and labels.
type exposition struct {
	types   map[string]string
	samples map[string]float64
}

func parseExposition(t *testing.T, text string) exposition {
	t.Helper()
	e := exposition{types: map[string]string{}, samples: map[string]float64{}}
	for line := range strings.SplitSeq(text, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			e.types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		e.samples[line[:i]] = v
	}
	return e
}

// labelNames returns the names of the labels of a sample's line, "le"
// left out, sorted.
func labelNames(sample string) []string {
	_, labels, ok := strings.Cut(sample, "{")
	if !ok {
		return nil
	}
	var names []string
	for pair := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
		if name, _, _ := strings.Cut(pair, "="); name != "le" {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// kubeProxyLabels are the labels of each of kube-proxy's metrics the agent
// keeps (kube-proxy v1.33 and later).
var kubeProxyLabels = map[string][]string{
	"kubeproxy_sync_proxy_rules_duration_seconds":              {"ip_family"},
	"kubeproxy_sync_full_proxy_rules_duration_seconds":         {"ip_family"},
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":      {"ip_family"},
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        {"ip_family"},
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": {"ip_family"},
	"kubeproxy_network_programming_duration_seconds":           {"ip_family"},
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      nil,
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":        nil,
	"kubeproxy_sync_proxy_rules_service_changes_pending":       nil,
	"kubeproxy_sync_proxy_rules_service_changes_total":         nil,
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      {"ip_family", "traffic_policy"},
	"kubeproxy_proxy_healthz_total":                            {"code"},
	"kubeproxy_proxy_livez_total":                              {"code"},
}

// TestKubeProxyMetrics scrapes the agent's /metrics over HTTP and finds
// every metric of kube-proxy's that it keeps, with kube-proxy's type,
// buckets and labels: what kube-proxy's proxier of each family reports,
// labelled ip_family, from an IPv4 service and a dual-stack one; and
// kproxy's own beside them; and the proxy's health on its own address,
// counted by code.
func TestKubeProxyMetrics(t *testing.T) {
	cfg := defaults()
	cfg.MinSyncInterval, cfg.NodeName = 10*time.Millisecond, "n1"
	cfg.MetricsAddr, cfg.HealthzBindAddress = freeAddr(t), freeAddr(t)
	p := &fake.Proxier{}
	a, src := startAgent(t, cfg, p, io.Discard)

	elsewhere := servicelb.Endpoint{Addr: netip.MustParseAddr("10.1.0.9"), NodeName: "n2"}
	elsewhere6 := servicelb.Endpoint{Addr: netip.MustParseAddr("fd00:1::9"), NodeName: "n2"}
	ext := servicelb.Service{
		Name: "ns/ext", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
		ExternalTrafficPolicy: servicelb.PolicyLocal, Endpoints: []servicelb.Endpoint{elsewhere},
	}
	internal := servicelb.Service{
		Name: "ns/int", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.12")},
		Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}},
		InternalTrafficPolicy: servicelb.PolicyLocal, Endpoints: []servicelb.Endpoint{elsewhere},
	}
	dual := servicelb.Service{
		Name: "ns/dual", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.13"), netip.MustParseAddr("fd00:96::13")},
		Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}},
		InternalTrafficPolicy: servicelb.PolicyLocal, Endpoints: []servicelb.Endpoint{elsewhere, elsewhere6},
	}
	cause := time.Now().Add(-2 * time.Second)
	require.NoError(t, src.UpsertTriggered(cause, web, ext, internal, dual))
	src.Synced()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := p.WaitSyncs(ctx, 1)
	require.NoError(t, err)
	web2 := web
	web2.Endpoints = append(web2.Endpoints, servicelb.Endpoint{Addr: netip.MustParseAddr("10.1.0.2")})
	require.NoError(t, src.Upsert(web2))
	_, err = p.WaitSyncs(ctx, 2)
	require.NoError(t, err)
	a.reporter("test")("ns/bad", errors.New("bad"))

	// The health server starts with the agent, maybe after its syncs.
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", cfg.HealthzBindAddress)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the health server never listened")
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := httpGet(t, "http://"+cfg.HealthzBindAddress+path)
		assert.Equal(t, 200, code, path)
		assert.Contains(t, body, `"healthy":true`, path)
		assert.Contains(t, body, `"status":{"IPv4":{`, path)
		assert.Contains(t, body, `"IPv6":{`, path)
	}

	byFamily := func(name string, v4, v6 float64) map[string]float64 {
		i := strings.IndexAny(name, "{")
		if i < 0 {
			return map[string]float64{name + `{ip_family="IPv4"}`: v4, name + `{ip_family="IPv6"}`: v6}
		}
		return map[string]float64{name[:i] + `{ip_family="IPv4",` + name[i+1:]: v4, name[:i] + `{ip_family="IPv6",` + name[i+1:]: v6}
	}
	want := map[string]float64{
		"kubeproxy_sync_proxy_rules_service_changes_total":    4,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":   5,
		"kubeproxy_sync_proxy_rules_service_changes_pending":  0,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending": 0,
		`kubeproxy_proxy_healthz_total{code="200"}`:           1,
		`kubeproxy_proxy_livez_total{code="200"}`:             1,
		`kproxy_invalid_objects_total{source="test"}`:         1,
	}
	for _, m := range []map[string]float64{
		byFamily("kubeproxy_sync_proxy_rules_duration_seconds_count", 2, 2),
		byFamily("kubeproxy_sync_full_proxy_rules_duration_seconds_count", 1, 1),
		byFamily("kubeproxy_sync_partial_proxy_rules_duration_seconds_count", 1, 1),
		byFamily(`kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="16.384"}`, 2, 2),
		byFamily("kubeproxy_network_programming_duration_seconds_count", 5, 1),
		byFamily(`kubeproxy_network_programming_duration_seconds_bucket{le="0"}`, 0, 0),
		byFamily(`kubeproxy_network_programming_duration_seconds_bucket{le="1"}`, 1, 0),
		byFamily(`kubeproxy_network_programming_duration_seconds_bucket{le="300"}`, 5, 1),
		byFamily(`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"}`, 2, 1),
		byFamily(`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"}`, 1, 0),
	} {
		maps.Copy(want, m)
	}
	var e exposition
	// The hooks run after each family's Sync returns: wait until every
	// sample has caught up, as a scrape a moment later sees it.
	var differ []string
	ok := assert.Eventually(t, func() bool {
		_, body := httpGet(t, "http://"+cfg.MetricsAddr+"/metrics")
		e = parseExposition(t, body)
		differ = differ[:0]
		for sample, v := range want {
			if got, ok := e.samples[sample]; !ok || got != v {
				differ = append(differ, fmt.Sprintf("%s %v (want %v)", sample, got, v))
			}
		}
		return len(differ) == 0
	}, 10*time.Second, 10*time.Millisecond)
	if !ok {
		t.Fatalf("samples that differ: %v", differ)
	}

	for name, typ := range map[string]string{
		"kubeproxy_sync_proxy_rules_duration_seconds":              "histogram",
		"kubeproxy_sync_full_proxy_rules_duration_seconds":         "histogram",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds":      "histogram",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        "gauge",
		"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "gauge",
		"kubeproxy_network_programming_duration_seconds":           "histogram",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      "gauge",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":        "counter",
		"kubeproxy_sync_proxy_rules_service_changes_pending":       "gauge",
		"kubeproxy_sync_proxy_rules_service_changes_total":         "counter",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      "gauge",
		"kubeproxy_proxy_healthz_total":                            "counter",
		"kubeproxy_proxy_livez_total":                              "counter",

		"kproxy_sync_proxy_rules_duration_seconds":              "histogram",
		"kproxy_network_programming_duration_seconds":           "histogram",
		"kproxy_sync_proxy_rules_last_timestamp_seconds":        "gauge",
		"kproxy_sync_proxy_rules_last_queued_timestamp_seconds": "gauge",
		"kproxy_sync_proxy_rules_failures_total":                "counter",
		"kproxy_sync_proxy_rules_service_changes_total":         "counter",
		"kproxy_sync_proxy_rules_service_changes_pending":       "gauge",
		"kproxy_invalid_objects_total":                          "counter",
	} {
		assert.Equal(t, typ, e.types[name], name)
	}
	for sample := range e.samples {
		name, _, _ := strings.Cut(sample, "{")
		if !strings.HasPrefix(name, "kubeproxy_") {
			continue
		}
		family := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		want, ok := kubeProxyLabels[family]
		if !ok {
			want, ok = kubeProxyLabels[name]
		}
		if assert.True(t, ok, "a metric of kube-proxy's not listed: %s", sample) {
			assert.Equal(t, want, labelNames(sample), "the labels of %s", sample)
		}
	}

	for sample, v := range want {
		got, ok := e.samples[sample]
		if assert.True(t, ok, "no sample %s", sample) {
			assert.Equal(t, v, got, sample)
		}
	}
	for _, f := range []string{"IPv4", "IPv6"} {
		for _, name := range []string{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"} {
			sample := name + `{ip_family="` + f + `"}`
			assert.InDelta(t, float64(time.Now().Unix()), e.samples[sample], 10, sample)
		}
	}
	for le := range strings.SplitSeq("0 0.25 0.5 1 59 60 115 120 300", " ") {
		assert.Contains(t, e.samples, fmt.Sprintf(`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="%s"}`, le), "kube-proxy's bucket %s", le)
	}
	buckets := 0
	for sample := range e.samples {
		if strings.HasPrefix(sample, `kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",`) {
			buckets++
		}
	}
	assert.Equal(t, 82, buckets, "kube-proxy's 81 buckets and +Inf")
}

// With Profiling, Go's profiles are served on the metrics address beside
// /metrics; without, they are not.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint(on), func(t *testing.T) {
			cfg := defaults()
			cfg.MetricsAddr, cfg.Profiling = freeAddr(t), on
			startAgent(t, cfg, &fake.Proxier{}, io.Discard)
			url := "http://" + cfg.MetricsAddr
			require.Eventually(t, func() bool {
				resp, err := http.Get(url + "/metrics")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil
			}, 5*time.Second, 10*time.Millisecond)
			code, body := httpGet(t, url+"/debug/pprof/")
			if on {
				assert.Equal(t, http.StatusOK, code)
				assert.Contains(t, body, "goroutine")
				code, _ = httpGet(t, url+"/debug/pprof/heap?debug=1")
				assert.Equal(t, http.StatusOK, code)
			} else {
				assert.Equal(t, http.StatusNotFound, code)
			}
			code, body = httpGet(t, url+"/metrics")
			assert.Equal(t, http.StatusOK, code)
			assert.True(t, strings.Contains(body, "kubeproxy_sync_proxy_rules_service_changes_total"), "kube-proxy's metrics on /metrics")
			if !on {
				return
			}
			// A profile longer than the server's write timeout runs:
			// the client gives up first.
			_, err := (&http.Client{Timeout: time.Second}).Get(url + "/debug/pprof/profile?seconds=11")
			var ne net.Error
			if assert.ErrorAs(t, err, &ne, "an 11 s profile") {
				assert.True(t, ne.Timeout(), "an 11 s profile: %v", err)
			}
		})
	}
}

// TestMetricsServerLimits: the metrics server answers GET and HEAD only,
// and holds at most MetricsMaxConns connections: one beyond is closed at
// once, with a warning.
func TestMetricsServerLimits(t *testing.T) {
	cfg := defaults()
	cfg.MetricsAddr = freeAddr(t)
	var logs logBuffer
	a, err := New(Options{Config: cfg, Dataplane: &fake.Proxier{}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	url := "http://" + cfg.MetricsAddr
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "/metrics")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	for _, path := range []string{"/metrics", "/healthz", "/proxyMode"} {
		resp, err := http.Post(url+path, "text/plain", strings.NewReader("x"))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, path)
	}
	for range MetricsMaxConns {
		c, err := net.Dial("tcp", cfg.MetricsAddr)
		require.NoError(t, err)
		defer c.Close()
	}
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		extra, err := net.Dial("tcp", cfg.MetricsAddr)
		if !assert.NoError(c, err) {
			return
		}
		defer extra.Close()
		_ = extra.SetReadDeadline(time.Now().Add(time.Second))
		_, err = extra.Read(make([]byte, 1))
		assert.ErrorIs(c, err, io.EOF, "a connection beyond the cap was kept")
	}, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs.String(), `server=metrics maxConns=64`)
}

// TestExposed: profiling on an address other hosts reach is warned of.
func TestExposed(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:10249": false, "[::1]:10249": false, "0.0.0.0:10249": true, "[::]:10249": true, "10.0.0.1:10249": true,
	} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		require.NoError(t, err)
		assert.Equal(t, want, exposed(a), addr)
	}
}
