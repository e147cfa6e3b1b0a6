// Package e2e runs an agent's sources the way the agent binaries do, for
// the tests that drive them from real servers, and checks the outcome two
// ways: in the state the runner applied (a fake dataplane, no privileges),
// and with real packets through a real backend in a namespace sandbox.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// NodeName is the sandbox node's name in the tests' endpoints.
const NodeName = "node-1"

// Target is a service port as the tests reach it.
type Target struct {
	// Service is the servicelb service name, such as "ns/web".
	Service string
	// URL is where the client sends requests, such as http://10.96.0.10:80/.
	URL string
}

// World is a running agent and a way to check what it did.
type World struct {
	Agent   *agent.Agent
	Reports *Reports
	// Fake is the dataplane in a fake world; nil with packets.
	Fake *fake.Proxier
	// Sandbox holds the node, client and backends with packets; nil in a
	// fake world.
	Sandbox *sandbox.Sandbox

	cancel context.CancelFunc
	done   chan error
}

// Reports collects what sources reported as invalid.
type Reports struct {
	mu  sync.Mutex
	got map[string][]string
}

func (r *Reports) add(object string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got = map[string][]string{}
	}
	r.got[object] = append(r.got[object], err.Error())
}

// Of returns the reports about object.
func (r *Reports) Of(object string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got[object])
}

// Config returns the agent configuration the tests use: the sandbox
// node's name and address, and default sync intervals.
func Config(backend string) agent.Config {
	var c agent.Config
	c.Backend = backend
	c.NodeName = NodeName
	c.NodeIPs = sandbox.NodeAddr.String()
	c.NodePortRange = "30000-32767"
	c.MinSyncInterval = time.Second
	c.MaxSyncInterval = time.Hour
	c.LogLevel = "debug"
	return c
}

// StartFake runs src with a fake dataplane that records what it applies.
func StartFake(t *testing.T, src agent.Source) *World {
	t.Helper()
	w := &World{Fake: &fake.Proxier{}, Reports: &Reports{}}
	a, err := agent.New(agent.Options{Config: Config("nftables"), Logger: testLogger(t), Dataplane: w.Fake, OnInvalid: w.Reports.add})
	if err != nil {
		t.Fatal(err)
	}
	w.start(t, a, src)
	return w
}

// StartPackets builds a sandbox with three backends serving HTTP on port
// 8080 and runs src with the named real backend programming the sandbox
// node, which also serves the proxy's health on HealthzPort and the
// services' health check node ports, as an agent does by default. Each
// mod changes the agent's configuration first. It skips (fails under CI)
// when the backend cannot run here.
func StartPackets(t *testing.T, backend string, src agent.Source, mods ...func(*agent.Config)) *World {
	t.Helper()
	testutil.RequireRoot(t)
	sb, err := sandbox.New(sandbox.Options{Backends: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Error(err)
		}
	})
	for _, b := range sb.Backends {
		if err := b.ServeHTTP(8080); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config(backend)
	cfg.NetNS = sb.Node.NSName
	cfg.Cleanup = true
	cfg.HealthzBindAddress = netip.AddrPortFrom(sandbox.NodeAddr, HealthzPort).String()
	cfg.ServiceHealthChecks = true
	for _, mod := range mods {
		mod(&cfg)
	}
	w := &World{Sandbox: sb, Reports: &Reports{}}
	a, err := agent.New(agent.Options{Config: cfg, Logger: testLogger(t), OnInvalid: w.Reports.add})
	if errors.Is(err, agent.ErrNoBackend) || errors.Is(err, agent.ErrUnsupported) {
		testutil.SkipOrFail(t, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	w.start(t, a, src)
	return w
}

func (w *World) start(t *testing.T, a *agent.Agent, src agent.Source) {
	w.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan error, 1)
	go func() { w.done <- a.Run(ctx, src) }()
	t.Cleanup(func() {
		if err := w.Stop(); err != nil {
			t.Error(err)
		}
	})
}

// Stop ends the agent and returns its error.
func (w *World) Stop() error {
	if w.cancel == nil {
		return nil
	}
	w.cancel()
	w.cancel = nil
	err := <-w.done
	w.Agent.Close()
	return err
}

// Expect waits up to within for the target to be served by exactly the
// backends numbered want (1-based), and fails t otherwise. With no backend
// wanted, it waits for requests to fail (or the service to have no
// backends, in a fake world).
func (w *World) Expect(t *testing.T, within time.Duration, tg Target, want ...int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	start := time.Now()
	var err error
	if w.Fake != nil {
		err = w.expectFake(ctx, tg, want)
	} else {
		err = w.expectPackets(ctx, tg, want)
	}
	if err != nil {
		if w.Sandbox != nil {
			t.Logf("node's rules:\n%s", w.kernelRules())
		}
		t.Fatalf("%s: want backends %v within %s: %v", tg.Service, want, within, err)
	}
	t.Logf("%s served by %v after %s", tg.Service, want, time.Since(start).Round(time.Millisecond))
}

func wantNames(want []int) []string {
	var out []string
	for _, i := range want {
		out = append(out, fmt.Sprintf("backend-%d", i))
	}
	if len(out) == 0 {
		out = []string{"error"}
	}
	slices.Sort(out)
	return out
}

func (w *World) expectPackets(ctx context.Context, tg Target, want []int) error {
	names := wantNames(want)
	// 10 requests per backend make missing one by chance unlikely (3 *
	// (2/3)^30 for three backends).
	n := 10 * len(want) * len(want)
	if n == 0 {
		// Failing requests take the request timeout each: two tell.
		n = 2
	}
	_, err := w.Sandbox.Eventually(ctx, tg.URL, n, func(c sandbox.Counts) bool {
		got := slices.Sorted(maps.Keys(c))
		return slices.Equal(got, names)
	})
	return err
}

func (w *World) expectFake(ctx context.Context, tg Target, want []int) error {
	var wantAddrs []netip.Addr
	for _, i := range want {
		wantAddrs = append(wantAddrs, sandbox.BackendAddr(i))
	}
	var last []netip.Addr
	for {
		last = appliedBackends(w.Fake.Applied(), tg.Service)
		if slices.Equal(last, wantAddrs) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("applied backends %v: %w", last, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// appliedBackends returns the sorted addresses of the backends the state
// selects for a service's cluster traffic.
func appliedBackends(st *servicelb.State, svc string) []netip.Addr {
	if st == nil {
		return nil
	}
	var out []netip.Addr
	for _, sp := range st.ServicePorts(svc) {
		for _, b := range sp.Targets(sp.Internal[servicelb.FromOutside]) {
			out = append(out, b.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// kernelRules lists the node namespace's rules with the tools, for a
// failing test's log.
func (w *World) kernelRules() string {
	var b strings.Builder
	for _, argv := range [][]string{{"nft", "list", "ruleset"}, {"ipvsadm", "-Ln"}, {"conntrack", "-L"}} {
		_ = sandbox.In(w.Sandbox.Node.NS, func() error {
			out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			fmt.Fprintf(&b, "$ %s (%v)\n%s\n", strings.Join(argv, " "), err, out)
			return nil
		})
	}
	return b.String()
}

// HealthzPort is where a packet world's agent serves the proxy's health,
// on the sandbox node's address: kube-proxy's port.
const HealthzPort = 10256

// Answer is an HTTP answer the sandbox's client got.
type Answer struct {
	Code int
	Body string
}

// Health sends the client's GET of path to port on the sandbox node's
// address (a health check node port, HealthzPort), and returns the answer.
func (w *World) Health(ctx context.Context, port uint16, path string) (Answer, error) {
	url := "http://" + netip.AddrPortFrom(sandbox.NodeAddr, port).String() + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Answer{}, err
	}
	resp, err := w.Sandbox.Client.HTTPClient(time.Second).Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return Answer{Code: resp.StatusCode, Body: string(b)}, err
}

// ExpectHealth waits up to within for the client's GET of path on port of
// the sandbox node to answer code, and returns the answer.
func (w *World) ExpectHealth(t *testing.T, within time.Duration, port uint16, path string, code int) Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		a, err := w.Health(ctx, port, path)
		if err == nil && a.Code == code {
			return a
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s:%d%s: want %d within %s, got %+v, %v", sandbox.NodeAddr, port, path, code, within, a, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitReport waits up to within for a report about object containing sub.
func (w *World) WaitReport(t *testing.T, within time.Duration, object, sub string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, r := range w.Reports.Of(object) {
			if strings.Contains(r, sub) {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no report about %s containing %q within %s; got %q", object, sub, within, w.Reports.Of(object))
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
