package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/conntrack"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// defaults returns the flags' defaults, but with nothing listening: the
// tests that want the health servers say where.
func defaults() Config {
	var c Config
	fs := newFlagSet()
	c.RegisterFlags(fs)
	c.HealthzBindAddress, c.ServiceHealthChecks = "", false
	// No pins: the other backends' cleanup after the first sync never
	// looks at the host's bpf filesystem.
	c.BPFPinPath = ""
	return c
}

func TestNode(t *testing.T) {
	c := defaults()
	c.NodeName, c.NodeIPs, c.ClusterCIDRs, c.NodePortRange = "n1", "10.0.0.1, 2001:db8::1", "10.244.0.0/16", "30000-30100"
	n, err := c.Node()
	if err != nil {
		t.Fatal(err)
	}
	if n.NodeName != "n1" || len(n.NodeIPs) != 2 || n.NodeIPs[1] != netip.MustParseAddr("2001:db8::1") ||
		n.ClusterCIDRs[0] != netip.MustParsePrefix("10.244.0.0/16") || n.NodePortRange != (servicelb.PortRange{Min: 30000, Max: 30100}) {
		t.Errorf("Node() = %+v", n)
	}
	for _, bad := range []struct{ field, value, want string }{
		{"ips", "10.0.0", "--node-ips"},
		{"cidrs", "10.244.0.0/33", "--cluster-cidrs"},
		{"range", "30100-30000", "--nodeport-range"},
		{"hostbits", "10.244.0.1/16", "host bits"},
	} {
		c := defaults()
		switch bad.field {
		case "ips":
			c.NodeIPs = bad.value
		case "cidrs", "hostbits":
			c.ClusterCIDRs = bad.value
		case "range":
			c.NodePortRange = bad.value
		}
		if _, err := c.Node(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s %q: err %v, want %q", bad.field, bad.value, err, bad.want)
		}
	}
}

func TestBackendSelection(t *testing.T) {
	if _, err := Open("bogus", BackendOptions{NetNS: netns.None()}); err == nil || !strings.Contains(err.Error(), "want one of ebpf, iptables, ipvs, nftables, userspace") {
		t.Errorf("Open(bogus) = %v", err)
	}
	// Whatever this kernel has, an error names the backend and what is
	// missing.
	for _, name := range BackendNames() {
		_, err := Open(name, BackendOptions{NetNS: netns.None()})
		if err == nil {
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, name+":") {
			t.Errorf("Open(%s) = %q, want it to start with the backend's name", name, msg)
		}
		if !errors.Is(err, ErrNoBackend) && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrOptions) && !strings.Contains(msg, "CAP_NET_ADMIN") {
			t.Errorf("Open(%s) = %q: neither a missing backend, missing kernel support, a missing option nor missing privilege", name, msg)
		}
		if errors.Is(err, ErrUnsupported) && !strings.Contains(msg, "CONFIG_") {
			t.Errorf("Open(%s) = %q: does not name the kernel option", name, msg)
		}
	}
}

// startAgent runs an agent with one source, "test", registered before it
// starts, so that it does not sync before the source says it is synced.
func startAgent(t *testing.T, cfg Config, p *fake.Proxier, out io.Writer) (*Agent, *servicelb.Source) {
	t.Helper()
	a, err := New(Options{Config: cfg, Dataplane: p, Stdout: out})
	if err != nil {
		t.Fatal(err)
	}
	src := a.Runner().Source("test")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; a.Close() })
	return a, src
}

var web = servicelb.Service{
	Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
	Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80}},
	Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.1.0.1")}},
}

func TestDryRunOnce(t *testing.T) {
	cfg := defaults()
	cfg.DryRun, cfg.Once = true, true
	p := &fake.Proxier{}
	var out bytes.Buffer
	a, err := New(Options{Config: cfg, Dataplane: p, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	src := a.Runner().Source("test")
	if err := src.Upsert(web); err != nil {
		t.Fatal(err)
	}
	src.Synced()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("--once did not exit after the first sync")
	}
	want := "# nftables dry run, sync 1: 1 services\nns/web:http/ipv4 tcp 10.96.0.10:80 -> 10.1.0.1:80\n"
	if out.String() != want {
		t.Errorf("dry run printed\n%s\nwant\n%s", out.String(), want)
	}
	if len(p.Records()) != 0 {
		t.Error("a dry run synced the dataplane")
	}
}

// --once exits after the first sync whether it succeeded or not, as its
// help says: a failed first sync is returned, not retried.
func TestOnceFailedSync(t *testing.T) {
	cfg := defaults()
	cfg.Once = true
	p := &fake.Proxier{}
	boom := errors.New("boom")
	p.FailNext(boom)
	a, err := New(Options{Config: cfg, Dataplane: p})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	src := a.Runner().Source("test")
	if err := src.Upsert(web); err != nil {
		t.Fatal(err)
	}
	src.Synced()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = a.Run(ctx)
	if !errors.Is(err, boom) {
		t.Fatalf("Run returned %v, want the first sync's error", err)
	}
	if ctx.Err() != nil || len(p.Records()) != 1 {
		t.Fatalf("--once retried the failed sync: %d syncs", len(p.Records()))
	}
	fs := newFlagSet()
	var c Config
	c.RegisterFlags(fs)
	if usage := fs.Lookup("once").Usage; !strings.Contains(usage, "1 with its error if it failed") {
		t.Errorf("--once's help does not say a failed first sync ends it: %q", usage)
	}
}

func TestMetricsAndHealthz(t *testing.T) {
	cfg := defaults()
	cfg.MinSyncInterval = 10 * time.Millisecond
	p := &fake.Proxier{}
	a, src := startAgent(t, cfg, p, io.Discard)
	h := Handler(a.Metrics(), "nftables", a.health, time.Minute)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/healthz"); code != 503 || !strings.Contains(body, "ready=false") {
		t.Errorf("/healthz before sync: %d %q", code, body)
	}
	if code, body := get("/proxyMode"); code != 200 || body != "nftables" {
		t.Errorf("/proxyMode: %d %q, want 200 nftables, as kube-proxy answers", code, body)
	}
	if err := src.Upsert(web); err != nil {
		t.Fatal(err)
	}
	src.Synced()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.WaitSyncs(ctx, 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !a.health().Ready && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, "ready=true pending=0") {
		t.Errorf("/healthz after sync: %d %q", code, body)
	}
	p.FailNext(errors.New("boom"))
	web2 := web
	web2.Endpoints = nil
	if err := src.Upsert(web2); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitSyncs(ctx, 2); err != nil {
		t.Fatal(err)
	}
	a.reporter("test")("ns/bad", errors.New("bad"))
	time.Sleep(20 * time.Millisecond) // the hook runs after Sync returns
	_, body := get("/metrics")
	for _, want := range []string{
		`kproxy_sync_proxy_rules_duration_seconds_count{backend="nftables"} 2`,
		`kproxy_network_programming_duration_seconds_count{backend="nftables"} 1`,
		`kproxy_sync_proxy_rules_failures_total{backend="nftables"} 1`,
		`kproxy_sync_proxy_rules_service_changes_total{backend="nftables"} 1`,
		`kproxy_invalid_objects_total{source="test"} 1`,
		`kproxy_sync_proxy_rules_last_queued_timestamp_seconds{backend="nftables"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := testutil.ToFloat64(a.Metrics().lastSync); n < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last sync timestamp %v", n)
	}
}

// A source that fails ends Run with its error.
func TestSourceFailure(t *testing.T) {
	a, err := New(Options{Config: defaults(), Dataplane: &fake.Proxier{}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	err = a.Run(context.Background(), failing{})
	if err == nil || !strings.Contains(err.Error(), "source broken: it broke") {
		t.Errorf("Run = %v", err)
	}
}

type failing struct{}

func (failing) Name() string { return "broken" }
func (failing) Run(context.Context, *servicelb.Source, Reporter) error {
	return errors.New("it broke")
}

// TestNodePortAndConntrackFlags: --nodeport-addresses takes CIDRs, read
// as kube-proxy reads them (host bits dropped, leading zeros allowed), or
// "primary" alone; --localhost-nodeports and the --conntrack-* flags reach
// the node config and the tuning; a bad value names its flag.
func TestNodePortAndConntrackFlags(t *testing.T) {
	var c Config
	fs := newFlagSet()
	c.RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{"--node-ips=10.0.0.1", "--nodeport-addresses=10.0.0.1/8, 192.0.02.0/24", "--localhost-nodeports",
		"--conntrack-max-per-core=32768", "--conntrack-min=131072", "--conntrack-tcp-timeout-established=24h",
		"--conntrack-tcp-timeout-close-wait=1h", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=2m"}))
	n, err := c.Node()
	require.NoError(t, err)
	assert.False(t, n.NodePortPrimary)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24")}, n.NodePortAddresses)
	assert.True(t, n.LocalhostNodePorts)
	assert.Equal(t, conntrack.Tuning{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour,
		TCPCloseWaitTimeout: time.Hour, TCPBeLiberal: true, UDPTimeout: 30 * time.Second, UDPStreamTimeout: 2 * time.Minute}, c.Conntrack)

	c = Config{}
	fs = newFlagSet()
	c.RegisterFlags(fs)
	require.NoError(t, fs.Parse([]string{"--node-ips=10.0.0.1", "--nodeport-addresses=primary"}))
	n, err = c.Node()
	require.NoError(t, err)
	assert.True(t, n.NodePortPrimary)
	assert.Empty(t, n.NodePortAddresses)

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodeport-addresses=10.0.0.1"}, "--nodeport-addresses"},
		{[]string{"--nodeport-addresses=primray"}, "--nodeport-addresses"},
		{[]string{"--nodeport-addresses=primary, 192.0.2.0/24"}, "--nodeport-addresses"},
		{[]string{"--conntrack-udp-timeout=1500ms"}, "--conntrack-*"},
	} {
		var c Config
		fs := newFlagSet()
		c.RegisterFlags(fs)
		require.NoError(t, fs.Parse(bad.args))
		_, err := c.Node()
		require.Error(t, err, "%v", bad.args)
		assert.Contains(t, err.Error(), bad.want)
	}
}

// TestNodeDetectLocal: the local-traffic detection flags, with
// kube-proxy's names, become the node's DetectLocal; a mode without its
// parameter, a parameter of another mode or a malformed one is refused
// with the field servicelb names.
func TestNodeDetectLocal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		want  servicelb.DetectLocal
		error string
	}{
		{"default", func(*Config) {}, servicelb.DetectLocal{}, ""},
		{"node CIDRs", func(c *Config) { c.DetectLocalMode, c.NodeCIDRs = "NodeCIDR", "10.244.1.0/24, fd00:244:1::/64" },
			servicelb.DetectLocal{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{
				netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}, ""},
		{"bridge", func(c *Config) { c.DetectLocalMode, c.PodBridgeInterface = "BridgeInterface", "cbr0" },
			servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"}, ""},
		{"prefix", func(c *Config) { c.DetectLocalMode, c.PodInterfaceNamePrefix = "InterfaceNamePrefix", "veth" },
			servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, ""},
		{"unknown mode", func(c *Config) { c.DetectLocalMode = "Bridge" }, servicelb.DetectLocal{}, "detectLocal.mode"},
		{"bridge without mode", func(c *Config) { c.PodBridgeInterface = "cbr0" }, servicelb.DetectLocal{}, "detectLocal.bridgeInterface"},
		{"mode without bridge", func(c *Config) { c.DetectLocalMode = "BridgeInterface" }, servicelb.DetectLocal{}, "detectLocal.bridgeInterface"},
		{"malformed node CIDR", func(c *Config) { c.DetectLocalMode, c.NodeCIDRs = "NodeCIDR", "10.244.1.0/33" }, servicelb.DetectLocal{}, "--node-cidrs"},
		{"long bridge name", func(c *Config) { c.DetectLocalMode, c.PodBridgeInterface = "BridgeInterface", "a-very-long-bridge" },
			servicelb.DetectLocal{}, "name too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults()
			tc.edit(&c)
			n, err := c.Node()
			if tc.error != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.error)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, n.DetectLocal)
		})
	}
}

// --masquerade-bit sets the node's masquerade mark; a bit out of 1-31 is
// refused.
func TestMasqueradeBit(t *testing.T) {
	c := defaults()
	assert.Equal(t, 14, c.MasqueradeBit)
	c.MasqueradeBit = 13
	n, err := c.Node()
	require.NoError(t, err)
	assert.Equal(t, uint32(1<<13), n.MasqueradeMark())
	for _, bad := range []int{-1, 32} {
		c.MasqueradeBit = bad
		_, err := c.Node()
		assert.ErrorContains(t, err, fmt.Sprintf("--masquerade-bit %d: want 1 to 31", bad))
	}
}

// A running backend cleans up every other but those whose objects it
// uses: ebpf keeps the nftables table, its packet path; nftables removes
// ebpf's pins. Without a pin path the ebpf backend leaves nothing behind,
// and its cleanup, which needs no cgroup, says so and touches nothing.
func TestOtherBackends(t *testing.T) {
	assert.NotContains(t, others("ebpf"), "nftables")
	assert.NotContains(t, others("ebpf"), "ebpf")
	assert.Contains(t, others("nftables"), "ebpf")
	assert.Contains(t, others("ebpf"), "iptables")
	for _, name := range BackendNames() {
		assert.NotContains(t, others(name), name)
	}
	err := Cleanup(context.Background(), "ebpf", BackendOptions{})
	assert.ErrorIs(t, err, ErrNothingOwned)
	assert.True(t, skipped(err))
	assert.NoError(t, Cleanup(context.Background(), "ebpf", BackendOptions{PinPath: filepath.Join(t.TempDir(), "none")}))
}

// The cleanup of a backend whose kernel module is not loaded touches
// nothing, and does not probe the kernel, which would load it.
func TestCleanupNotPresent(t *testing.T) {
	b := backends["ipvs"]
	defer func() { backends["ipvs"] = b }()
	probed := false
	b2 := b
	b2.absent = func() error { return errors.New("no ip_vs") }
	b2.probe = func(BackendOptions) error { probed = true; return nil }
	backends["ipvs"] = b2
	err := Cleanup(context.Background(), "ipvs", BackendOptions{})
	assert.ErrorIs(t, err, ErrNothingOwned)
	assert.ErrorContains(t, err, "ipvs: cleanup: nothing of the backend can be there: no ip_vs")
	assert.False(t, probed)
}

// source is a Source that delivers its services and says it is synced as
// soon as it runs. onName, when set, runs the first time the agent asks
// its name.
type source struct {
	name   string
	svcs   []servicelb.Service
	onName func()
	once   sync.Once
}

func (s *source) Name() string {
	if s.onName != nil {
		s.once.Do(s.onName)
	}
	return s.name
}

func (s *source) Run(ctx context.Context, dst *servicelb.Source, _ Reporter) error {
	for _, svc := range s.svcs {
		if err := dst.Upsert(svc); err != nil {
			return err
		}
	}
	dst.Synced()
	<-ctx.Done()
	return nil
}

// An agent registers every source before its runner and its sources run,
// so that no sync applies a state that lacks a source's services. The
// first source here delivers at once; the agent asks the second's name
// only after the runner had time to sync what the first delivered, were
// it running already.
func TestSourcesRegisteredBeforeRun(t *testing.T) {
	cfg := defaults()
	cfg.MetricsAddr, cfg.MinSyncInterval = "", time.Millisecond
	p := &fake.Proxier{}
	a, err := New(Options{Config: cfg, Dataplane: p})
	require.NoError(t, err)
	defer a.Close()
	api := web
	api.Name, api.ClusterIPs = "ns/api", []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	first := &source{name: "first", svcs: []servicelb.Service{web}}
	second := &source{name: "second", svcs: []servicelb.Service{api}, onName: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, _ = p.WaitSyncs(ctx, 1)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, first, second) }()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_, err = p.WaitSyncs(wait, 1)
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, err)
	for i, rec := range p.Records() {
		_, hasWeb := rec.State.Service("ns/web")
		_, hasAPI := rec.State.Service("ns/api")
		assert.True(t, hasWeb && hasAPI, "sync %d applied %d services, not both sources'", i+1, rec.State.Len())
	}
}

// logBuffer is a bytes.Buffer for a logger that the agent's goroutines
// share.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A service the backend leaves out of a sync (SyncReport.LeftOut, the
// rest applied) is reported once as an invalid object of the backend: the
// kproxy_invalid_objects_total{source="backend"} counter, an error in the
// log naming it, and Options.OnInvalid. A later sync that leaves the same
// service out reports nothing new.
func TestLeftOutReported(t *testing.T) {
	cfg := defaults()
	cfg.MetricsAddr, cfg.MinSyncInterval = "", time.Millisecond
	p := &fake.Proxier{}
	var logs logBuffer
	var reported []string
	var mu sync.Mutex
	a, err := New(Options{Config: cfg, Dataplane: p, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		OnInvalid: func(object string, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, object+": "+err.Error())
		}})
	require.NoError(t, err)
	defer a.Close()
	refusal := &servicelb.ValidationError{Service: "ns/web", Field: "ports", Value: "ns/web:http/ipv4",
		Err: fmt.Errorf("%w: nfnl: commit: add rule inet kproxy svc4-ns/web/http: no such file or directory", servicelb.ErrRefused)}
	p.FailNext(refusal, refusal)
	src := a.Runner().Source("test")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	api := web
	api.Name, api.ClusterIPs = "ns/api", []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	require.NoError(t, src.Upsert(web))
	require.NoError(t, src.Upsert(api))
	src.Synced()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	_, err = p.WaitSyncs(wait, 1)
	require.NoError(t, err)
	api.Endpoints = nil
	require.NoError(t, src.Upsert(api))
	_, err = p.WaitSyncs(wait, 2)
	require.NoError(t, err)
	// The hooks run after Sync returns: wait for the second sync's.
	require.Eventually(t, func() bool { return a.health().AppliedAt.After(time.Time{}) && a.health().Pending == 0 },
		5*time.Second, 5*time.Millisecond)
	time.Sleep(20 * time.Millisecond)

	assert.Equal(t, 1.0, testutil.ToFloat64(a.Metrics().invalid.WithLabelValues("backend")))
	mu.Lock()
	assert.Equal(t, []string{"ns/web: " + refusal.Error()}, reported)
	mu.Unlock()
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "source=backend") {
			lines = append(lines, l)
		}
	}
	require.Len(t, lines, 1, "log:\n%s", logs.String())
	assert.Contains(t, lines[0], "level=ERROR")
	assert.Contains(t, lines[0], `msg="service ports left out: the backend refused them"`)
	assert.Contains(t, lines[0], "object=ns/web")
	assert.Contains(t, lines[0], "ports ns/web:http/ipv4: refused by the kernel")
}

// An error about a backend names it once: a backend package's errors
// start with its name, and the agent adds none to them (ebpf here: a
// cgroup directory that is not cgroup v2, and pins that cannot be
// removed).
func TestBackendNamedOnce(t *testing.T) {
	b := backends["ebpf"]
	defer func() { backends["ebpf"] = b }()
	b2 := b
	b2.probe = func(BackendOptions) error { return nil } // nf_tables, for the packet path: not what fails here
	backends["ebpf"] = b2
	_, err := Open("ebpf", BackendOptions{NetNS: netns.None(), Cgroup: t.TempDir()})
	require.ErrorIs(t, err, ErrUnsupported)
	assert.Equal(t, 1, strings.Count(err.Error(), "ebpf"), err.Error())
	assert.True(t, strings.HasPrefix(err.Error(), "ebpf: missing cgroup v2: "), err.Error())

	pins := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(pins, "link_connect4", "not-a-pin"), 0o755))
	err = Cleanup(context.Background(), "ebpf", BackendOptions{PinPath: pins})
	require.Error(t, err)
	assert.Equal(t, 1, strings.Count(err.Error(), "ebpf"), err.Error())
	assert.True(t, strings.HasPrefix(err.Error(), "ebpf: remove pins: unpin link_connect4: "), err.Error())
}

// follower is a source that learns the node's zone and service CIDRs
// before it reports itself synced, and a second zone after.
type follower struct {
	source
	update func(func(*servicelb.NodeConfig))
	later  chan struct{}
}

func (f *follower) FollowNode(update func(func(*servicelb.NodeConfig))) { f.update = update }

func (f *follower) Run(ctx context.Context, dst *servicelb.Source, _ Reporter) error {
	f.update(func(n *servicelb.NodeConfig) {
		n.Zone = "zone-a"
		n.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	})
	// A node the runner refuses changes nothing.
	f.update(func(n *servicelb.NodeConfig) { n.Zone, n.DetectLocal.Mode = "zone-x", "Bogus" })
	for _, svc := range f.svcs {
		if err := dst.Upsert(svc); err != nil {
			return err
		}
	}
	dst.Synced()
	<-f.later
	f.update(func(n *servicelb.NodeConfig) { n.Zone = "zone-b" })
	<-ctx.Done()
	return nil
}

// A NodeFollower's edits of the node reach the runner: those made before
// the source is synced are in the first sync, later ones in a later sync;
// an edit the runner refuses (an unknown detect-local mode) changes
// nothing.
func TestNodeFollower(t *testing.T) {
	cfg := defaults()
	cfg.MetricsAddr, cfg.MinSyncInterval = "", time.Millisecond
	p := &fake.Proxier{}
	a, err := New(Options{Config: cfg, Dataplane: p})
	require.NoError(t, err)
	defer a.Close()
	f := &follower{source: source{name: "follower", svcs: []servicelb.Service{web}}, later: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, f) }()
	defer func() { cancel(); require.NoError(t, <-done) }()
	wait, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	recs, err := p.WaitSyncs(wait, 1)
	require.NoError(t, err)
	node := recs[0].State.Node()
	assert.Equal(t, "zone-a", node.Zone)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, node.ServiceCIDRs)
	close(f.later)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		recs := p.Records()
		assert.Equal(c, "zone-b", recs[len(recs)-1].State.Node().Zone)
	}, 10*time.Second, 10*time.Millisecond)
}
