//go:build privileged || vm

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// newSandbox builds a sandbox of one backend serving HTTP on 8080.
func newSandbox(t *testing.T) *sandbox.Sandbox {
	t.Helper()
	testutil.RequireRoot(t)
	sb, err := sandbox.New(sandbox.Options{Backends: 1, RequestTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sb.Close()) })
	require.NoError(t, sb.Backends[0].ServeHTTP(8080))
	return sb
}

// in runs a tool in the sandbox node's namespace and returns its output
// and whether it succeeded.
func in(t *testing.T, sb *sandbox.Sandbox, argv ...string) (string, bool) {
	t.Helper()
	var out []byte
	var err error
	require.NoError(t, sandbox.In(sb.Node.NS, func() error {
		out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput()
		return nil
	}))
	return string(out), err == nil
}

// owned says what each backend leaves in a namespace, as the tools show
// it: whether any of it is there.
func owned(t *testing.T, sb *sandbox.Sandbox) map[string]bool {
	t.Helper()
	_, table := in(t, sb, "nft", "list", "table", "inet", "kproxy")
	save, _ := in(t, sb, "iptables-nft-save")
	save6, _ := in(t, sb, "ip6tables-nft-save")
	iptables := false
	for _, l := range strings.Split(save+save6, "\n") {
		if strings.Contains(l, "KPROXY-") && !strings.Contains(l, "KPROXY-IPVS-") {
			iptables = true
		}
	}
	_, link := in(t, sb, "ip", "link", "show", "kproxy-ipvs0")
	sets, _ := in(t, sb, "ipset", "list", "-n")
	servers, _ := in(t, sb, "ipvsadm", "-Ln")
	return map[string]bool{
		"nftables": table,
		"iptables": iptables,
		"ipvs": link || strings.Contains(sets, "kproxy-ipvs-") || strings.Contains(save+save6, "KPROXY-IPVS-") ||
			strings.Contains(servers, "TCP  10.96.0.10:80"),
	}
}

// syncBackend writes the example file's services with a backend, through
// the library, as a kproxy of that backend that stopped would leave them.
func syncBackend(t *testing.T, sb *sandbox.Sandbox, name string) {
	t.Helper()
	p, err := filesource.Parse("services.yaml", exampleServices)
	require.NoError(t, err)
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{sandbox.NodeAddr}}
	st, err := servicelb.NewState(node, p.Services...)
	require.NoError(t, err)
	d, err := agent.Open(name, agent.BackendOptions{NetNS: sb.Node.NS, Node: node})
	require.NoError(t, err)
	defer func() {
		if c, ok := d.(interface{ Close() error }); ok {
			assert.NoError(t, c.Close())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, d.Sync(ctx, st))
}

func ourBackends() []string { return append([]string{"nftables", "iptables"}, vmBackends...) }

// kproxy --cleanup removes what every backend owns in the namespace (the
// nftables table, the iptables chains and jumps, the IPVS virtual servers,
// link, sets and helper rules) and nothing else; a backend the kernel
// cannot run is skipped with a note.
func TestCleanup(t *testing.T) {
	sb := newSandbox(t)
	for _, b := range ourBackends() {
		syncBackend(t, sb, b)
	}
	for _, b := range ourBackends() {
		require.True(t, owned(t, sb)[b], "%s wrote nothing", b)
	}
	// Someone else's table and chain.
	_, ok := in(t, sb, "nft", "add", "table", "inet", "other")
	require.True(t, ok)
	out, ok := in(t, sb, "iptables-nft", "-t", "filter", "-N", "OTHER")
	require.True(t, ok, out)

	code, _, logs := run(t, "--cleanup", "--netns", sb.Node.NSName, "--log-format", "json")
	require.Equal(t, 0, code, logs)
	for b, left := range owned(t, sb) {
		assert.False(t, left, "%s's objects left after --cleanup", b)
	}
	_, ok = in(t, sb, "nft", "list", "table", "inet", "other")
	assert.True(t, ok, "someone else's table removed")
	save, _ := in(t, sb, "iptables-nft-save")
	assert.Contains(t, save, ":OTHER - [0:0]", "someone else's chain removed")

	said := map[string]string{}
	for _, rec := range jsonLogs(t, logs) {
		if b, ok := rec["backend"].(string); ok {
			said[b] = fmt.Sprint(rec["msg"], ": ", rec["reason"])
		}
	}
	for _, b := range agent.BackendNames() {
		if contains(ourBackends(), b) {
			assert.Equal(t, "cleanup: removed what the backend owns: <nil>", said[b], b)
		} else {
			// Not in this kernel: skipped, saying why.
			assert.Contains(t, said[b], "cleanup: backend skipped: ", b)
			assert.Contains(t, said[b], "kernel support missing", b)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// kproxy removes the rules of the backend that ran before it, as
// kube-proxy removes its other modes' rules, once its own first sync is
// in; traffic flows through the new backend.
func TestSwitchBackend(t *testing.T) {
	sb := newSandbox(t)
	order := append([]string{"iptables"}, vmBackends...)
	order = append(order, "nftables")
	for i, b := range order {
		code, _, logs := run(t, "--source", "file", "--file", servicesFile(t), "--backend", b, "--once",
			"--netns", sb.Node.NSName, "--node-name", "node", "--node-ips", sandbox.NodeAddr.String(),
			"--healthz-bind-address=", "--health-check-node-ports=false")
		require.Equal(t, 0, code, logs)
		have := owned(t, sb)
		assert.True(t, have[b], "%s: its rules are in", b)
		if i > 0 {
			assert.False(t, have[order[i-1]], "%s: %s's rules left", b, order[i-1])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := sb.Eventually(ctx, "http://10.96.0.11:80/", 3, func(c sandbox.Counts) bool { return c["backend-1"] == 3 })
		cancel()
		assert.NoError(t, err, "%s: traffic to the cluster IP", b)
	}
}
