package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func TestProgramHelpAndBadFlags(t *testing.T) {
	p := Program{Name: "x", Usage: "x: does things", Sources: func(Setup) ([]Source, error) { return nil, nil }}
	var errOut bytes.Buffer
	if code := p.Run(context.Background(), []string{"--help"}, io.Discard, &errOut); code != 0 {
		t.Errorf("--help exit %d", code)
	}
	for _, want := range []string{"x: does things", "  --backend", "  --dry-run", "  --metrics-bind-address", "  --cleanup", "  --config", "  --version",
		"  --log-format", "  --profiling", "nftables, iptables, ipvs, ebpf", "or userspace"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	if code := p.Run(context.Background(), []string{"--bogus"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("bad flag exit %d, want 2", code)
	}
	errOut.Reset()
	if code := p.Run(context.Background(), []string{"--backend", "bogus"}, io.Discard, &errOut); code != 1 || !strings.Contains(errOut.String(), `--backend \"bogus\"`) {
		t.Errorf("bad backend: exit %d, %q", code, errOut.String())
	}
}

// oneService is a source of one service.
type oneService struct{ svc servicelb.Service }

func (s oneService) Name() string { return "one" }

func (s oneService) Run(ctx context.Context, dst *servicelb.Source, _ Reporter) error {
	if err := dst.Upsert(s.svc); err != nil {
		return err
	}
	dst.Synced()
	<-ctx.Done()
	return nil
}

// TestProgramNodeCIDRs: under --detect-local-mode=NodeCIDR without
// --node-cidrs, a program that knows its node's pod CIDRs supplies them,
// and the rules recognise pods by them; --node-cidrs wins; without a node
// name the program refuses to start.
func TestProgramNodeCIDRs(t *testing.T) {
	var asked []string
	p := Program{Name: "x", Usage: "x",
		Sources: func(Setup) ([]Source, error) { return []Source{oneService{web}}, nil },
		NodeCIDRs: func(_ context.Context, node string) ([]netip.Prefix, error) {
			asked = append(asked, node)
			return []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}, nil
		},
	}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var out, errOut bytes.Buffer
		code := p.Run(ctx, append([]string{"--backend", "iptables", "--dry-run", "--once"}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := run("--detect-local-mode", "NodeCIDR", "--node-name", "n1")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, []string{"n1"}, asked)
	assert.Contains(t, out, "! -s 10.1.0.0/24 -d 10.96.0.10/32")

	code, out, errOut = run("--detect-local-mode", "NodeCIDR", "--node-name", "n1", "--node-cidrs", "10.2.0.0/24")
	require.Equal(t, 0, code, errOut)
	assert.Len(t, asked, 1, "asked for the node's CIDRs with --node-cidrs given")
	assert.Contains(t, out, "! -s 10.2.0.0/24 -d 10.96.0.10/32")

	code, _, errOut = run("--detect-local-mode", "NodeCIDR")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "--node-name")

	code, out, errOut = run("--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "-d 10.96.0.10/32 ! -i cbr0")
	assert.Len(t, asked, 1)
}

// runProgram runs p with args and nothing listening but what args ask
// for, and returns its exit code, output and logs.
func runProgram(t *testing.T, p Program, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := p.Run(ctx, append([]string{"--metrics-bind-address", "", "--healthz-bind-address", ""}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}

// seen is a Sources hook that keeps the configuration it is given and
// stops the program.
func seen(got *Config) func(Setup) ([]Source, error) {
	return func(s Setup) ([]Source, error) {
		*got = *s.Config
		return nil, errors.New("stop")
	}
}

// A config file's settings fill the flags the command line does not set;
// the command line wins; every ignored field is logged as a warning naming
// it, and so are the file's other remarks; a value a flag refuses names
// the field.
func TestProgramConfigFile(t *testing.T) {
	var got Config
	var asked []string
	file := ConfigFile{
		Settings: []FileSetting{
			{Field: "mode", Flag: "backend", Value: "ipvs"},
			{Field: "clusterCIDR", Flag: "cluster-cidrs", Value: "10.244.0.0/16"},
			{Field: "iptables.syncPeriod", Flag: "max-sync-interval", Value: "45s"},
			{Field: "logging.format", Flag: "log-format", Value: "json"},
		},
		Ignored: []IgnoredField{
			{Field: "configSyncPeriod", Value: "15m0s", Reason: "no relist"},
			{Field: "oomScoreAdj", Value: "-999", Reason: "the kubelet's"},
		},
		Warnings: []string{`unknown field "bogus" (ignored)`},
	}
	p := Program{Name: "x", Usage: "x", Sources: seen(&got),
		LoadConfig: func(path string, given func(string) (string, bool)) (ConfigFile, error) {
			b, set := given("backend")
			asked = append(asked, fmt.Sprintf("%s backend=%s set=%t", path, b, set))
			return file, nil
		}}
	code, _, logs := runProgram(t, p, "--config", "kp.yaml", "--backend", "nftables")
	assert.Equal(t, 1, code)
	assert.Equal(t, []string{"kp.yaml backend=nftables set=true"}, asked)
	assert.Equal(t, "nftables", got.Backend, "the command line wins")
	assert.Equal(t, "10.244.0.0/16", got.ClusterCIDRs)
	assert.Equal(t, 45*time.Second, got.MaxSyncInterval)
	assert.Equal(t, "json", got.LogFormat)

	var warnings []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "a JSON log line: %s", line)
		if rec["level"] == "WARN" {
			warnings = append(warnings, rec)
		}
	}
	require.Len(t, warnings, 3, logs)
	assert.Equal(t, `config: unknown field "bogus" (ignored)`, warnings[0]["msg"])
	assert.Equal(t, "config field ignored", warnings[1]["msg"])
	assert.Equal(t, "configSyncPeriod", warnings[1]["field"])
	assert.Equal(t, "15m0s", warnings[1]["value"])
	assert.Equal(t, "no relist", warnings[1]["reason"])
	assert.Equal(t, "oomScoreAdj", warnings[2]["field"])

	file.Settings = append(file.Settings, FileSetting{Field: "iptables.minSyncPeriod", Flag: "min-sync-interval", Value: "soon"})
	code, _, logs = runProgram(t, p, "--config", "kp.yaml")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, `config kp.yaml: iptables.minSyncPeriod: "soon": --min-sync-interval: invalid argument "soon"`)

	p.LoadConfig = func(string, func(string) (string, bool)) (ConfigFile, error) {
		return ConfigFile{}, errors.New("config kp.yaml: broken")
	}
	code, _, logs = runProgram(t, p, "--config", "kp.yaml")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, "config kp.yaml: broken")
}

// --metrics-addr still works, with a warning; --metrics-bind-address
// defaults to kube-proxy's address.
func TestProgramMetricsAddr(t *testing.T) {
	var got Config
	p := Program{Name: "x", Usage: "x", Sources: seen(&got)}
	var errOut bytes.Buffer
	assert.Equal(t, 1, p.Run(context.Background(), nil, io.Discard, &errOut))
	assert.Equal(t, "127.0.0.1:10249", got.MetricsAddr)
	assert.NotContains(t, errOut.String(), "deprecated")

	errOut.Reset()
	assert.Equal(t, 1, p.Run(context.Background(), []string{"--metrics-addr", "127.0.0.1:9999"}, io.Discard, &errOut))
	assert.Equal(t, "127.0.0.1:9999", got.MetricsAddr)
	assert.Contains(t, errOut.String(), "--metrics-addr is deprecated: use --metrics-bind-address")
}

// --version prints the name, the version and commit set at link time,
// and the Go version and platform, and runs nothing.
func TestProgramVersion(t *testing.T) {
	p := Program{Name: "kproxy", Build: NewBuildInfo("v1.2.3", "abc123"),
		Sources: func(Setup) ([]Source, error) { t.Error("--version started the program"); return nil, nil }}
	code, out, _ := runProgram(t, p, "--version")
	assert.Equal(t, 0, code)
	assert.Equal(t, fmt.Sprintf("kproxy v1.2.3 (commit abc123, %s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH), out)
}

// Without link-time values, the version and commit come from the build
// information Go records; without those, they are "unknown".
func TestBuildInfoFallback(t *testing.T) {
	b := BuildInfo{read: func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Version: "v0.4.0"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "deadbeef"}, {Key: "vcs.modified", Value: "true"}}}, true
	}}
	assert.Equal(t, "v0.4.0", b.Version())
	assert.Equal(t, "deadbeef-dirty", b.Revision())
	assert.Contains(t, b.Line("kproxy"), "kproxy v0.4.0 (commit deadbeef-dirty, go1.99, ")

	b.read = func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true }
	assert.Equal(t, "unknown", b.Version())
	assert.Equal(t, "unknown", b.Revision())
}

// --log-format json writes one JSON object a line; anything but text and
// json is refused.
func TestLogFormat(t *testing.T) {
	c := defaults()
	c.LogFormat = "json"
	var b bytes.Buffer
	log, err := c.LoggerTo(&b)
	require.NoError(t, err)
	log.Info("hello", "n", 1)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(b.Bytes(), &rec))
	assert.Equal(t, "hello", rec["msg"])
	assert.EqualValues(t, 1, rec["n"])

	c.LogFormat = "xml"
	_, err = c.LoggerTo(&b)
	assert.ErrorContains(t, err, `--log-format "xml": want text or json`)
}

// --cleanup with --dry-run is refused: a dry run removes nothing.
func TestProgramCleanupDryRun(t *testing.T) {
	p := Program{Name: "x", Usage: "x", Sources: func(Setup) ([]Source, error) { t.Error("--cleanup started sources"); return nil, nil }}
	code, _, logs := runProgram(t, p, "--cleanup", "--dry-run")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, "a dry run removes nothing")
}

// An address without a port gets the server's, as kube-proxy reads its
// address flags; anything else is left for the listener to judge.
func TestWithPort(t *testing.T) {
	assert.Equal(t, "0.0.0.0:10256", withPort("0.0.0.0", healthzPort))
	assert.Equal(t, "[::]:10249", withPort("::", DefaultMetricsPort))
	assert.Equal(t, "127.0.0.1:9000", withPort("127.0.0.1:9000", DefaultMetricsPort))
	assert.Equal(t, "", withPort("", DefaultMetricsPort), "off stays off")
	assert.Equal(t, "node-1", withPort("node-1", DefaultMetricsPort))
}

// --conntrack-tcp-be-liberal reaches the iptables backend: its forward
// chain drops no invalid packet, as kube-proxy's does not.
func TestConntrackTCPLiberalReachesIPTables(t *testing.T) {
	p := Program{Name: "x", Usage: "x", Sources: func(Setup) ([]Source, error) { return []Source{oneService{web}}, nil }}
	for _, tc := range []struct {
		args    []string
		invalid bool
	}{{nil, true}, {[]string{"--conntrack-tcp-be-liberal"}, false}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out, errOut bytes.Buffer
		code := p.Run(ctx, append([]string{"--backend", "iptables", "--dry-run", "--once", "--node-name", "n1"}, tc.args...), &out, &errOut)
		cancel()
		require.Equal(t, 0, code, errOut.String())
		assert.Equal(t, tc.invalid, strings.Contains(out.String(), "--ctstate INVALID -j DROP"), "%v:\n%s", tc.args, out.String())
	}
}
