package healthcheck

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestServiceAnswer: a health check node port answers as kube-proxy's:
// 200 with a local endpoint and a live proxy, 503 otherwise, the count in
// the body and in X-Load-Balancing-Endpoint-Weight, on every path.
func TestServiceAnswer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		service string
		local   int64
		live    bool
		code    int
		body    string
	}{
		{"healthy", "default/web", 2, true, 200,
			"{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"},
		{"no local endpoint", "default/web", 0, true, 503,
			"{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 0,\n\t\"serviceProxyHealthy\": true\n}"},
		{"proxy stalled", "web", 1, false, 503,
			"{\n\t\"service\": {\n\t\t\"namespace\": \"\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": false\n}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sv := &serviceServer{service: tc.service, healthy: func() bool { return tc.live }}
			sv.local.Store(tc.local)
			for _, path := range []string{"/", "/healthz"} {
				rec := httptest.NewRecorder()
				sv.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				assert.Equal(t, tc.code, rec.Code, path)
				assert.Equal(t, tc.body, rec.Body.String(), path)
				assert.Equal(t, http.Header{
					"Content-Type":                     {"application/json"},
					"X-Content-Type-Options":           {"nosniff"},
					"X-Load-Balancing-Endpoint-Weight": {strconv.FormatInt(tc.local, 10)},
				}, rec.Header(), path)
			}
		})
	}
}

// TestProxyAnswers: /healthz needs the first sync, a live proxy and an
// eligible node; /livez only a live proxy; both answer kube-proxy's JSON.
func TestProxyAnswers(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	applied := now.Add(-time.Hour)
	ready := servicelb.Health{Ready: true, AppliedAt: applied}
	for _, tc := range []struct {
		name        string
		h           servicelb.Health
		ineligible  bool
		healthz     int
		healthzBody string
		livez       int
		livezBody   string
	}{
		{"in sync", ready, false,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":true,"healthy":true}`,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":true}`},
		{"a change waiting less than the bound", servicelb.Health{Ready: true, AppliedAt: applied, QueuedAt: now.Add(-59 * time.Second)}, false,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":true,"healthy":true}`,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":true}`},
		{"a change waiting the bound", servicelb.Health{Ready: true, AppliedAt: applied, QueuedAt: now.Add(-time.Minute)}, false,
			503, `{"lastUpdated":"2026-01-01T11:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":true,"healthy":false}`,
			503, `{"lastUpdated":"2026-01-01T11:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":false}`},
		{"before the first sync", servicelb.Health{QueuedAt: now.Add(-time.Second)}, false,
			503, `{"lastUpdated":"0001-01-01T00:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":true,"healthy":false}`,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":true}`},
		{"node not eligible", ready, true,
			503, `{"lastUpdated":"2026-01-01T11:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":false,"healthy":true}`,
			200, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProxy(ProxyOptions{
				Health:       func() servicelb.Health { return tc.h },
				Now:          func() time.Time { return now },
				NodeEligible: func() bool { return !tc.ineligible },
			})
			require.NoError(t, err)
			get := func(path string) *httptest.ResponseRecorder {
				rec := httptest.NewRecorder()
				p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				return rec
			}
			for _, c := range []struct {
				path string
				code int
				body string
			}{{"/healthz", tc.healthz, tc.healthzBody}, {"/livez", tc.livez, tc.livezBody}} {
				rec := get(c.path)
				assert.Equal(t, c.code, rec.Code, c.path)
				assert.Equal(t, c.body, rec.Body.String(), c.path)
				assert.Equal(t, "application/json", rec.Header().Get("Content-Type"), c.path)
				assert.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"), c.path)
			}
			assert.Equal(t, tc.livez == 200, p.Live())
			assert.Equal(t, tc.healthz == 200, p.Healthy())
			assert.Equal(t, http.StatusNotFound, get("/").Code)
		})
	}
}

// TestProxyFamilyStatus: both answers hold kube-proxy's status of each
// address family: a family whose change waited the bound is unhealthy,
// and so is the proxy; each answer is counted by its code.
func TestProxyFamilyStatus(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	applied := now.Add(-time.Hour)
	h := servicelb.Health{Ready: true, AppliedAt: applied, QueuedAt: now.Add(-2 * time.Minute), Families: []servicelb.FamilyHealth{
		{Family: servicelb.IPv4, LastQueuedAt: now.Add(-3 * time.Hour)},
		{Family: servicelb.IPv6, QueuedAt: now.Add(-2 * time.Minute), LastQueuedAt: now.Add(-time.Second)},
	}}
	type answer struct {
		path string
		code int
	}
	var answers []answer
	p, err := NewProxy(ProxyOptions{
		Health:   func() servicelb.Health { return h },
		Now:      func() time.Time { return now },
		Answered: func(path string, code int) { answers = append(answers, answer{path, code}) },
	})
	require.NoError(t, err)
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	status := `"status":{"IPv4":{"lastUpdated":"2026-01-01T11:00:00Z","healthy":true},"IPv6":{"lastUpdated":"2026-01-01T11:00:00Z","healthy":false}}`
	rec := get("/healthz")
	assert.Equal(t, 503, rec.Code)
	assert.Equal(t, `{"lastUpdated":"2026-01-01T11:00:00Z","currentTime":"2026-01-01T12:00:00Z","nodeEligible":true,"healthy":false,`+status+`}`, rec.Body.String())
	rec = get("/livez")
	assert.Equal(t, 503, rec.Code)
	assert.Equal(t, `{"lastUpdated":"2026-01-01T11:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":false,`+status+`}`, rec.Body.String())

	h.QueuedAt, h.Families[1].QueuedAt = time.Time{}, time.Time{}
	rec = get("/livez")
	assert.Equal(t, 200, rec.Code)
	assert.Equal(t, `{"lastUpdated":"2026-01-01T12:00:00Z","currentTime":"2026-01-01T12:00:00Z","healthy":true,`+
		`"status":{"IPv4":{"lastUpdated":"2026-01-01T11:00:00Z","healthy":true},"IPv6":{"lastUpdated":"2026-01-01T11:00:00Z","healthy":true}}}`, rec.Body.String())
	get("/healthz")
	get("/")
	assert.Equal(t, []answer{{"/healthz", 503}, {"/livez", 503}, {"/livez", 200}, {"/healthz", 200}}, answers, "every answer of the two, and nothing else")
}

func TestProxyOptions(t *testing.T) {
	_, err := NewProxy(ProxyOptions{})
	assert.ErrorContains(t, err, "Health is required")
	_, err = NewProxy(ProxyOptions{Health: func() servicelb.Health { return servicelb.Health{} }, Timeout: -time.Second})
	assert.ErrorContains(t, err, "negative timeout")
	assert.Equal(t, time.Minute, DefaultTimeout(0))
	assert.Equal(t, 10*time.Second, DefaultTimeout(5*time.Second))
}
