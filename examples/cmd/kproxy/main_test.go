package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakekube "k8s.io/client-go/kubernetes/fake"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/consulsource"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/kube/kubeproxyconfig"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The example files, embedded so that the tests find them in the VM too
// (which holds a test binary and its testdata/ only).
var (
	//go:embed services.yaml
	exampleServices []byte
	//go:embed consul-mapping.yaml
	exampleMapping []byte
)

// servicesFile writes the example services file and returns its path.
func servicesFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "services.yaml")
	require.NoError(t, os.WriteFile(path, exampleServices, 0o644))
	return path
}

// run runs kproxy with args, serving no metrics and pinning nothing
// unless args say where (so that it never looks at the host's bpf
// filesystem), and returns its exit code, its output and its logs.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runFor(t, 2*time.Minute, args...)
}

// runFor runs kproxy as run does, stopping it after d.
func runFor(t *testing.T, d time.Duration, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, logs bytes.Buffer
	code := program().Run(ctx, append([]string{"--metrics-bind-address=", "--bpf-pin-path="}, args...), &out, &logs)
	return code, out.String(), logs.String()
}

// jsonLogs parses logs written with --log-format json.
func jsonLogs(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "not a JSON log line: %s", line)
		out = append(out, rec)
	}
	return out
}

// The commented services file is valid.
func TestExampleFile(t *testing.T) {
	p, err := filesource.Parse("services.yaml", exampleServices)
	require.NoError(t, err)
	require.Empty(t, p.Bad)
	assert.Len(t, p.Services, 2)
	_, err = servicelb.NewState(servicelb.NodeConfig{}, p.Services...)
	assert.NoError(t, p.Locate(err))
}

// The example Consul mapping file is valid.
func TestMappingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "consul-mapping.yaml")
	require.NoError(t, os.WriteFile(path, exampleMapping, 0o644))
	m, err := consulsource.LoadMapping(path)
	require.NoError(t, err)
	assert.Equal(t, consulsource.Mapping{VIP: "10.96.0.53", Port: 53, Protocol: "UDP"}, m["dns"])
}

// The file source prints the rules of the example file in a dry run.
func TestDryRunExampleFile(t *testing.T) {
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--backend", "iptables", "--dry-run", "--once", "--node-ips", "10.100.0.1")
	require.Equal(t, 0, code, logs)
	for _, want := range []string{"-d 10.96.0.10/32", "-d 10.96.0.11/32", "--dport 30080", "--to-destination 10.100.3.2:8080"} {
		has(t, out, want, "")
	}
}

// The ipvs backend renders a dry run without the kernel, as ipvsadm -Sn
// prints it, with or without strict ARP.
func TestDryRunIPVS(t *testing.T) {
	for _, strict := range []string{"false", "true"} {
		code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--backend", "ipvs", "--dry-run", "--once",
			"--node-ips", "10.100.0.1", "--ipvs-strict-arp="+strict)
		require.Equal(t, 0, code, logs)
		has(t, out, "-A -t 10.96.0.10:80", "")
	}
}

// The userspace backend renders a dry run with no privilege and holds
// nothing: what it would listen on.
func TestDryRunUserspace(t *testing.T) {
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--backend", "userspace", "--dry-run", "--once",
		"--node-ips", "10.100.0.1")
	require.Equal(t, 0, code, logs)
	has(t, out, "10.96.0.10", "")
}

// A source is chosen by --source; another source's flag is refused, not
// silently unused; an unknown source names the known ones.
func TestSourceChoice(t *testing.T) {
	code, _, logs := run(t, "--source", "file", "--file", servicesFile(t), "--kubeconfig", "/dev/null", "--dry-run", "--once")
	assert.Equal(t, 1, code)
	assert.Contains(t, logs, "--kubeconfig is for --source kubernetes, not file")

	code, _, logs = run(t, "--source", "file", "--consul-token", "x", "--dry-run", "--once")
	assert.Equal(t, 1, code)
	assert.Contains(t, logs, "--consul-token is for --source consul, not file")

	code, _, logs = run(t, "--source", "etcd", "--dry-run", "--once")
	assert.Equal(t, 1, code)
	assert.Contains(t, logs, `--source \"etcd\": want one of kubernetes, consul, file`)

	code, _, logs = run(t, "--source", "file", "--dry-run", "--once")
	assert.Equal(t, 1, code)
	assert.Contains(t, logs, "--file is required")
}

// A KubeProxyConfiguration file sets what kproxy supports: its mode picks
// the backend, its mode's section the masquerade; a flag overrides it; a
// warning names each set field kproxy ignores, once.
func TestKubeProxyConfigFile(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
logging: {format: json}
bindAddress: 10.100.0.1
configSyncPeriod: 15m
oomScoreAdj: -999
iptables: {masqueradeAll: true, syncPeriod: 10s}
ipvs: {scheduler: lc}
nftables: {masqueradeAll: false}
conntrack: {maxPerCore: 0}
`), 0o644))
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--config", cfg, "--dry-run", "--once")
	require.Equal(t, 0, code, logs)
	has(t, out, "# iptables dry run", "mode")
	has(t, out, `-d 10.96.0.10/32 -p tcp -m comment --comment "demo/web:http cluster IP" -m tcp --dport 80 -j KPROXY-MARK-MASQ`, "iptables.masqueradeAll")
	has(t, out, `-A KPROXY-SERVICES -d 10.100.0.1/32 -m comment --comment "kubernetes service nodeports`, "bindAddress is the node IP")

	warned := map[string]string{}
	for _, rec := range jsonLogs(t, logs) {
		if rec["msg"] == "config field ignored" {
			field := rec["field"].(string)
			assert.NotContains(t, warned, field, "warned twice")
			warned[field] = rec["reason"].(string)
		}
	}
	assert.Equal(t, []string{"clientConnection.kubeconfig", "configSyncPeriod", "oomScoreAdj"}, keys(warned))
	assert.Contains(t, warned["clientConnection.kubeconfig"], "--source is file")

	// --backend wins over the mode, and reads nftables' section.
	code, out, logs = run(t, "--source", "file", "--file", servicesFile(t), "--config", cfg, "--backend", "nftables", "--dry-run", "--once")
	require.Equal(t, 0, code, logs)
	has(t, out, "# nftables dry run", "--backend")
	assert.Contains(t, out, "set verdicts4/outside-cluster/pod-cluster/node-cluster {\n\t\ttype ipv4_addr . inet_proto . inet_service\n\t\telements = { 10.96.0.10 . tcp . 80 }",
		"nftables.masqueradeAll is false: the cluster IP's verdicts masquerade no flow")

	// The file must be a KubeProxyConfiguration.
	require.NoError(t, os.WriteFile(cfg, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644))
	code, _, logs = run(t, "--source", "file", "--file", servicesFile(t), "--config", cfg, "--dry-run", "--once")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, "want apiVersion kubeproxy.config.k8s.io/v1alpha1, kind KubeProxyConfiguration")
}

// A file kube-proxy runs with, kproxy runs with: detectLocalMode
// ClusterCIDR without a clusterCIDR tells no traffic local, with a
// warning, rather than ending the process; addresses without a port get
// kube-proxy's ports. What kube-proxy refuses, kproxy refuses, naming the
// field.
func TestKubeProxyConfigAsKubeProxyReadsIt(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
detectLocalMode: ClusterCIDR
healthzBindAddress: 0.0.0.0
`), 0o644))
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--config", cfg, "--dry-run", "--once")
	require.Equal(t, 0, code, logs)
	has(t, out, "# nftables dry run", "mode")
	assert.Contains(t, logs, "clusterCIDR is empty")

	require.NoError(t, os.WriteFile(cfg, []byte(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
nftables: {masqueradeBit: 40}
mode: nftables
`), 0o644))
	code, _, logs = run(t, "--source", "file", "--file", servicesFile(t), "--config", cfg, "--dry-run", "--once")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, `nftables.masqueradeBit "40": must be within 0 and 31`)
}

// kubeadm's kube-proxy command line runs as kube-proxy runs it: the
// ConfigMap's file as kubeadm writes it (no mode: iptables), the node's
// name from --hostname-override, lowered, and -v=2 in pflag's syntax.
func TestKubeadmCommandLine(t *testing.T) {
	cfg := filepath.Join("..", "..", "..", "kube", "kubeproxyconfig", "testdata", "kubeadm.yaml")
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--dry-run", "--once",
		"--config="+cfg, "--hostname-override=Node-1", "-v=2")
	require.Equal(t, 0, code, logs)
	has(t, out, "# iptables dry run", "kube-proxy's default mode")
	assert.Contains(t, logs, "node=node-1")
	assert.Equal(t, 1, strings.Count(logs, "config field ignored"), "only the kubeconfig, with --source file: %s", logs)
}

// kube-proxy's flags without a file mean what they mean to kube-proxy: a
// flag kproxy has no use for is named, not refused, and never one left at
// its default; --write-config-to writes the configuration and exits.
func TestKubeProxyFlags(t *testing.T) {
	written := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	code, _, logs := run(t, "--source", "file", "--file", servicesFile(t), "--log-format", "json",
		"--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "--oom-score-adj=-500", "--write-config-to", written)
	require.Equal(t, 0, code, logs)
	var ignored []string
	for _, rec := range jsonLogs(t, logs) {
		if rec["msg"] == "config field ignored" {
			ignored = append(ignored, rec["field"].(string)+"="+rec["value"].(string))
		}
	}
	assert.Equal(t, []string{"oomScoreAdj=-500"}, ignored)
	c, warnings, err := kubeproxyconfig.Load(written)
	require.NoError(t, err)
	assert.Empty(t, warnings)
	assert.EqualValues(t, "nftables", c.Mode)
	assert.Equal(t, "10.244.0.0/16", c.ClusterCIDR)
	assert.Equal(t, []string{"primary"}, c.NodePortAddresses)

	// They run: the mode is the backend.
	code, out, logs := run(t, "--source", "file", "--file", servicesFile(t), "--dry-run", "--once",
		"--proxy-mode", "nftables", "--cluster-cidr", "10.244.0.0/16", "--init-only=false")
	require.Equal(t, 0, code, logs)
	has(t, out, "# nftables dry run", "--proxy-mode")
	has(t, out, "10.244.0.0/16", "--cluster-cidr")

	// A bad value is refused as kube-proxy refuses it.
	code, _, logs = run(t, "--source", "file", "--file", servicesFile(t), "--dry-run", "--once", "--iptables-masquerade-bit=40")
	assert.Equal(t, 2, code)
	assert.Contains(t, logs, "iptables.masqueradeBit")
}

// has checks that out holds want, and shows only the start of out when it
// does not.
func has(t *testing.T, out, want, why string) {
	t.Helper()
	if !strings.Contains(out, want) {
		if len(out) > 3000 {
			out = out[:3000] + "..."
		}
		t.Errorf("%s: output lacks %q:\n%s", why, want, out)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// The API client takes --kube-api-qps, --kube-api-burst and
// --kube-api-content-type (kube-proxy's clientConnection).
func TestKubeClientSettings(t *testing.T) {
	kubeconfig := writeKubeconfig(t, "https://127.0.0.1:1", "token")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	k := &kubeSource{}
	k.register(fs)
	require.NoError(t, fs.Parse([]string{"--kubeconfig", kubeconfig, "--kube-api-qps", "7.5", "--kube-api-burst", "20",
		"--kube-api-content-type", "application/vnd.kubernetes.protobuf"}))
	cfg, err := k.restConfig()
	require.NoError(t, err)
	assert.Equal(t, float32(7.5), cfg.QPS)
	assert.Equal(t, 20, cfg.Burst)
	assert.Equal(t, "application/vnd.kubernetes.protobuf", cfg.ContentType)
	assert.Equal(t, "https://127.0.0.1:1", cfg.Host)
}

// With the kubernetes source and no --node-name, the node is named as
// the host, lower-cased, as kube-proxy names it; a given name is lowered
// and trimmed as kube-proxy's --hostname-override.
func TestNodeNameFromHostname(t *testing.T) {
	host, err := os.Hostname()
	require.NoError(t, err)
	k := &kubeSource{opts: kube.ClientOptions{Kubeconfig: writeKubeconfig(t, "https://127.0.0.1:1", "token")}}
	var cfg agent.Config
	s := agent.Setup{Config: &cfg, Logger: discard(), Given: func(string) bool { return false }}
	_, err = k.start(s)
	require.NoError(t, err)
	assert.Equal(t, strings.ToLower(host), cfg.NodeName)

	cfg.NodeName = " Node-1.Example "
	_, err = k.start(s)
	require.NoError(t, err)
	assert.Equal(t, "node-1.example", cfg.NodeName)
}

// writeKubeconfig writes a kubeconfig for server with a bearer token.
func writeKubeconfig(t *testing.T, server, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+server+`", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: "`+token+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	return path
}

// Under detect-local-mode NodeCIDR, the node's pod CIDRs are waited for:
// a Node not there yet, or without pod CIDRs yet, delays the start
// rather than ending it; the context ends the wait.
func TestPodCIDRsAwaited(t *testing.T) {
	client := fakekube.NewClientset()
	k := &kubeSource{client: client, log: func(string, ...any) {}}
	got := make(chan []netip.Prefix, 1)
	go func() {
		cidrs, err := k.podCIDRs(context.Background(), "node-1")
		assert.NoError(t, err)
		got <- cidrs
	}()
	time.Sleep(1500 * time.Millisecond)
	ctx := context.Background()
	n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond)
	select {
	case c := <-got:
		t.Fatalf("returned %v before the Node had pod CIDRs", c)
	default:
	}
	n.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	require.NoError(t, err)
	select {
	case c := <-got:
		assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, c)
	case <-time.After(10 * time.Second):
		t.Fatal("the pod CIDRs were not read")
	}

	ctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = k.podCIDRs(ctx, "node-2")
	assert.ErrorIs(t, err, context.Canceled)
}

// The Node's facts fill in what the flags and the file leave unsaid: its
// primary addresses, its zone, its pod CIDRs under NodeCIDR; the
// ServiceCIDRs the service CIDRs. What the command line gives stays.
func TestKubeNodeFollows(t *testing.T) {
	node := kube.Node{Name: "n1", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}, Zone: "zone-a",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	follow := func(cfg agent.Config) servicelb.NodeConfig {
		t.Helper()
		k := &kubeSource{opts: kube.ClientOptions{Kubeconfig: writeKubeconfig(t, "https://127.0.0.1:1", "token")}}
		cfg.NodeName = "n1"
		src, err := k.start(agent.Setup{Config: &cfg, Logger: discard(), Given: func(string) bool { return false }})
		require.NoError(t, err)
		f, ok := src.(agent.NodeFollower)
		require.True(t, ok, "the kubernetes source follows the node")
		var n servicelb.NodeConfig
		f.FollowNode(func(edit func(*servicelb.NodeConfig)) { edit(&n) })
		ks := src.(*kubeNode)
		ks.OnNode(node)
		ks.OnServiceCIDRs(cidrs)
		return n
	}
	n := follow(agent.Config{DetectLocalMode: "NodeCIDR"})
	assert.Equal(t, node.IPs, n.NodeIPs)
	assert.Equal(t, "zone-a", n.Zone)
	assert.Equal(t, node.PodCIDRs, n.DetectLocal.NodeCIDRs)
	assert.Equal(t, cidrs, n.ServiceCIDRs)

	n = follow(agent.Config{NodeIPs: "192.0.2.99", Zone: "given", ServiceCIDRs: "10.97.0.0/16", NodeCIDRs: "10.245.0.0/24", DetectLocalMode: "NodeCIDR"})
	assert.Empty(t, n.NodeIPs, "--node-ips stays")
	assert.Empty(t, n.Zone, "--zone stays")
	assert.Empty(t, n.DetectLocal.NodeCIDRs, "--node-cidrs stays")
	assert.Empty(t, n.ServiceCIDRs, "--service-cidrs stays")

	n = follow(agent.Config{})
	assert.Empty(t, n.DetectLocal.NodeCIDRs, "pod CIDRs only under NodeCIDR")
}
