package agent

import (
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// The userspace backend's flags make its Options: addresses held by
// default, none with --userspace-hold-addresses=false, the timeouts, and
// --userspace-listen-at's service ports served where it says (the family
// of a port is its address's), for the port's first frontend only.
func TestUserspaceFlags(t *testing.T) {
	parse := func(args ...string) (userspace.Options, error) {
		t.Helper()
		var c Config
		fs := newFlagSet()
		c.RegisterFlags(fs)
		require.NoError(t, fs.Parse(args))
		return c.Userspace.Options()
	}
	o, err := parse()
	require.NoError(t, err)
	assert.True(t, o.HoldAddresses)
	assert.Nil(t, o.Listen, "every frontend at its own address")
	o, err = parse("--userspace-hold-addresses")
	require.NoError(t, err)
	assert.True(t, o.HoldAddresses)

	o, err = parse("--userspace-hold-addresses=false", "--userspace-connect-timeout=250ms", "--userspace-idle-timeout=-1s",
		"--userspace-drain-timeout=30s", "--userspace-udp-idle-timeout=2m", "--userspace-udp-stream-timeout=3m", "--userspace-stall-timeout=90s",
		"--userspace-max-flows=1000", "--userspace-max-port-flows=300",
		"--userspace-listen-at", "demo/web:http=127.0.0.1:18080, demo/dns=[::1]:5353")
	require.NoError(t, err)
	assert.False(t, o.HoldAddresses)
	assert.Equal(t, 250*time.Millisecond, o.ConnectTimeout)
	assert.Equal(t, -time.Second, o.IdleTimeout)
	assert.Equal(t, 30*time.Second, o.DrainTimeout)
	assert.Equal(t, 2*time.Minute, o.UDPIdleTimeout)
	assert.Equal(t, 90*time.Second, o.StallTimeout)
	assert.Equal(t, 3*time.Minute, o.UDPStreamTimeout)
	assert.Equal(t, 1000, o.MaxFlows)
	assert.Equal(t, 300, o.MaxPortFlows)
	require.NotNil(t, o.Listen)
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		servicelb.Service{Name: "demo/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080}}},
		servicelb.Service{Name: "demo/dns", ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00::10")},
			Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}})
	require.NoError(t, err)
	listens := map[string]string{}
	for _, sp := range st.Ports() {
		for _, f := range sp.Frontends() {
			if at, ok := o.Listen(sp, f); ok {
				listens[f.String()] = at.String()
			}
		}
	}
	assert.Equal(t, map[string]string{"cluster IP 10.96.0.10:80": "127.0.0.1:18080", "cluster IP [fd00::10]:53": "[::1]:5353",
		"node port 192.0.2.1:30080": "192.0.2.1:30080"}, listens, "the named ports where they are named, node ports where they are")
	o, err = parse("--userspace-hold-addresses=false")
	require.NoError(t, err)
	listens = map[string]string{}
	for _, sp := range st.Ports() {
		for _, f := range sp.Frontends() {
			if at, ok := o.Listen(sp, f); ok {
				listens[f.String()] = at.String()
			}
		}
	}
	assert.Equal(t, map[string]string{"node port 192.0.2.1:30080": "192.0.2.1:30080"}, listens,
		"without held addresses, only the node ports where they are")

	for _, bad := range [][]string{
		{"--userspace-listen-at", "demo/web:http"},
		{"--userspace-listen-at", "demo/web=127.0.0.1"},
		{"--userspace-listen-at", "=127.0.0.1:1"},
		{"--userspace-listen-at", "a/b=0.0.0.0:1"},
		{"--userspace-listen-at", "a/b=127.0.0.1:1,a/b=127.0.0.1:2"},
		{"--userspace-connect-timeout=-1s"},
	} {
		_, err := parse(bad...)
		assert.Error(t, err, "%q", bad)
	}
	var c Config
	fs := newFlagSet()
	c.RegisterFlags(fs)
	assert.Error(t, fs.Parse([]string{"--userspace-hold-addresses=maybe"}))
}

type fakeStats []userspace.PortStats

func (f fakeStats) Stats() []userspace.PortStats { return f }

// The userspace backend's counters are exported per service port, under
// the names the README lists.
func TestUserspaceMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newPortStatsCollector(fakeStats{{
		Key:      servicelb.ServicePortKey{Service: "demo/web", Port: "http", Family: servicelb.IPv4},
		Protocol: servicelb.TCP, Active: 3, Accepted: 10, BytesIn: 1000, BytesOut: 5000, DialErrors: 2, Refused: 1, Drained: 4, SessionsDropped: 0,
		Shed: 5, LocalErrors: 6, Evicted: 7,
	}}))
	e := parseExposition(t, scrape(t, reg))
	l := `{family="ipv4",port="http",protocol="tcp",service="demo/web"}`
	for name, v := range map[string]float64{
		"kproxy_userspace_active_connections" + l:         3,
		"kproxy_userspace_accepted_total" + l:             10,
		"kproxy_userspace_dial_errors_total" + l:          2,
		"kproxy_userspace_refused_total" + l:              1,
		"kproxy_userspace_drained_total" + l:              4,
		"kproxy_userspace_udp_sessions_dropped_total" + l: 0,
		"kproxy_userspace_shed_total" + l:                 5,
		"kproxy_userspace_local_errors_total" + l:         6,
		"kproxy_userspace_udp_sessions_evicted_total" + l: 7,
		`kproxy_userspace_bytes_total{direction="in",family="ipv4",port="http",protocol="tcp",service="demo/web"}`:  1000,
		`kproxy_userspace_bytes_total{direction="out",family="ipv4",port="http",protocol="tcp",service="demo/web"}`: 5000,
	} {
		got, ok := e.samples[name]
		if assert.True(t, ok, "no sample %s", name) {
			assert.Equal(t, v, got, name)
		}
	}
	assert.Equal(t, "gauge", e.types["kproxy_userspace_active_connections"])
	assert.Equal(t, "counter", e.types["kproxy_userspace_bytes_total"])
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	for _, name := range userspaceMetrics {
		assert.True(t, strings.Contains(string(readme), "`"+name+"`"), "examples/README.md does not list %s", name)
	}
}

// scrape returns the registry's metrics in Prometheus' text format.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	return rec.Body.String()
}
