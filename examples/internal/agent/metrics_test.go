package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
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

// TestKubeProxyMetrics scrapes the agent's /metrics over HTTP and finds
// every metric of kube-proxy's that it keeps, with kube-proxy's type and
// buckets, and kproxy's own beside them; and the proxy's health on its
// own address.
func TestKubeProxyMetrics(t *testing.T) {
	cfg := defaults()
	cfg.MinSyncInterval, cfg.NodeName = 10*time.Millisecond, "n1"
	cfg.MetricsAddr, cfg.HealthzBindAddress = freeAddr(t), freeAddr(t)
	p := &fake.Proxier{}
	a, src := startAgent(t, cfg, p, io.Discard)

	elsewhere := servicelb.Endpoint{Addr: netip.MustParseAddr("10.1.0.9"), NodeName: "n2"}
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
	cause := time.Now().Add(-2 * time.Second)
	require.NoError(t, src.UpsertTriggered(cause, web, ext, internal))
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

	var e exposition
	require.Eventually(t, func() bool { // the hooks run after Sync returns
		_, body := httpGet(t, "http://"+cfg.MetricsAddr+"/metrics")
		e = parseExposition(t, body)
		return e.samples["kubeproxy_network_programming_duration_seconds_count"] == 4
	}, 5*time.Second, 10*time.Millisecond)

	for name, typ := range map[string]string{
		"kubeproxy_sync_proxy_rules_duration_seconds":         "histogram",
		"kubeproxy_sync_full_proxy_rules_duration_seconds":    "histogram",
		"kubeproxy_sync_partial_proxy_rules_duration_seconds": "histogram",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds":   "gauge",
		"kubeproxy_network_programming_duration_seconds":      "histogram",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending": "gauge",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":   "counter",
		"kubeproxy_sync_proxy_rules_service_changes_pending":  "gauge",
		"kubeproxy_sync_proxy_rules_service_changes_total":    "counter",
		"kubeproxy_sync_proxy_rules_no_local_endpoints_total": "gauge",

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
	for sample, want := range map[string]float64{
		"kubeproxy_sync_proxy_rules_duration_seconds_count":                              2,
		"kubeproxy_sync_full_proxy_rules_duration_seconds_count":                         1,
		"kubeproxy_sync_partial_proxy_rules_duration_seconds_count":                      1,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="16.384"}`:                2,
		`kubeproxy_network_programming_duration_seconds_bucket{le="0"}`:                  0,
		`kubeproxy_network_programming_duration_seconds_bucket{le="1"}`:                  1,
		`kubeproxy_network_programming_duration_seconds_bucket{le="300"}`:                4,
		"kubeproxy_sync_proxy_rules_service_changes_total":                               3,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total":                              4,
		"kubeproxy_sync_proxy_rules_service_changes_pending":                             0,
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending":                            0,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="internal"}`: 1,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy="external"}`: 1,
		`kproxy_invalid_objects_total{source="test"}`:                                    1,
	} {
		got, ok := e.samples[sample]
		if assert.True(t, ok, "no sample %s", sample) {
			assert.Equal(t, want, got, sample)
		}
	}
	assert.InDelta(t, float64(time.Now().Unix()), e.samples["kubeproxy_sync_proxy_rules_last_timestamp_seconds"], 10)
	for le := range strings.SplitSeq("0 0.25 0.5 1 59 60 115 120 300", " ") {
		assert.Contains(t, e.samples, fmt.Sprintf(`kubeproxy_network_programming_duration_seconds_bucket{le="%s"}`, le), "kube-proxy's bucket %s", le)
	}
	assert.Len(t, programmingBuckets, 81)

	for _, path := range []string{"/healthz", "/livez"} {
		code, body := httpGet(t, "http://"+cfg.HealthzBindAddress+path)
		assert.Equal(t, 200, code, path)
		assert.Contains(t, body, `"healthy":true`, path)
	}
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
			assert.Contains(t, body, "kubeproxy_sync_proxy_rules_duration_seconds")
		})
	}
}
