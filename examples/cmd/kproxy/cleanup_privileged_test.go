//go:build privileged || vm

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/examples/internal/testutil"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
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

// bpfEnv is a private cgroup v2 mount with a cgroup of its own and a
// private bpf filesystem, for the ebpf backend: the tests never attach to
// the host's cgroups nor pin in its /sys/fs/bpf.
type bpfEnv struct {
	cgroup, pins string
	env          *ebpftest.Env
}

func newBPFEnv(t *testing.T) bpfEnv {
	t.Helper()
	e, err := ebpftest.New("kproxy-cmd-test")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, e.Close()) })
	return bpfEnv{cgroup: e.Cgroup, pins: filepath.Join(e.BPFFS, "kproxy"), env: e}
}

// args are kproxy's flags for the ebpf backend in the env.
func (e bpfEnv) args() []string { return []string{"--cgroup", e.cgroup, "--bpf-pin-path", e.pins} }

// hooks counts the programs attached to the env's cgroup at the hooks
// the ebpf backend uses.
func (e bpfEnv) hooks(t *testing.T) int {
	t.Helper()
	ids, err := ebpf.Attached(e.cgroup)
	require.NoError(t, err)
	return len(ids)
}

// owned says what each backend leaves in a namespace (and, for ebpf, in
// the env's cgroup and bpf filesystem), as the tools show it: whether any
// of it is there.
func owned(t *testing.T, sb *sandbox.Sandbox, e bpfEnv) map[string]bool {
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
	_, dummy := in(t, sb, "ip", "link", "show", "kproxy-ipvs0")
	sets, _ := in(t, sb, "ipset", "list", "-n")
	servers, _ := in(t, sb, "ipvsadm", "-Ln")
	pins, err := filepath.Glob(filepath.Join(e.pins, "*"))
	require.NoError(t, err)
	// The userspace backend holds the services' addresses on the loopback.
	lo, _ := in(t, sb, "ip", "address", "show", "dev", "lo")
	return map[string]bool{
		"userspace": strings.Contains(lo, " 10.96.0.10/"),
		"nftables":  table,
		"iptables":  iptables,
		"ipvs": dummy || strings.Contains(sets, "kproxy-ipvs-") || strings.Contains(save+save6, "KPROXY-IPVS-") ||
			strings.Contains(servers, "TCP  10.96.0.10:80"),
		"ebpf": len(pins) > 0 || e.hooks(t) > 0,
	}
}

// settled returns what owned says once none of the backends not listed
// in keep has anything left, or after 10 s: the kernel detaches a hook
// whose last pin went in deferred work.
func settled(t *testing.T, sb *sandbox.Sandbox, e bpfEnv, keep ...string) map[string]bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		have := owned(t, sb, e)
		left := false
		for b, ok := range have {
			left = left || ok && !slices.Contains(keep, b)
		}
		if !left || time.Now().After(deadline) {
			return have
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBackend writes the example file's services with a backend, through
// the library, as a kproxy of that backend that stopped would leave them.
func syncBackend(t *testing.T, sb *sandbox.Sandbox, e bpfEnv, name string) {
	t.Helper()
	p, err := filesource.Parse("services.yaml", exampleServices)
	require.NoError(t, err)
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{sandbox.NodeAddr}}
	st, err := servicelb.NewState(node, p.Services...)
	require.NoError(t, err)
	d, err := agent.Open(name, agent.BackendOptions{NetNS: sb.Node.NS, Node: node, Cgroup: e.cgroup, PinPath: e.pins})
	require.NoError(t, err)
	defer func() {
		if c, ok := d.(interface{ Close() error }); ok {
			assert.NoError(t, c.Close())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = servicetest.SyncErr(d.Sync(ctx, st))
	require.NoError(t, err)
}

func ourBackends() []string {
	return append([]string{"nftables", "iptables", "ebpf", "userspace"}, vmBackends...)
}

// kproxy --cleanup removes what every backend owns in the namespace (the
// nftables table, the iptables chains and jumps, the IPVS virtual servers,
// link, sets and helper rules, the ebpf hooks and pins) and nothing else;
// a backend the kernel cannot run is skipped with a note.
func TestCleanup(t *testing.T) {
	sb := newSandbox(t)
	e := newBPFEnv(t)
	// ebpf first: its packet path's table is the nftables backend's,
	// which the nftables backend then adopts.
	order := []string{"ebpf", "nftables", "iptables", "userspace"}
	order = append(order, vmBackends...)
	for _, b := range order {
		syncBackend(t, sb, e, b)
	}
	for b, have := range owned(t, sb, e) {
		require.True(t, have || !slices.Contains(ourBackends(), b), "%s wrote nothing", b)
	}
	// Someone else's table, chain and pin.
	_, ok := in(t, sb, "nft", "add", "table", "inet", "other")
	require.True(t, ok)
	out, ok := in(t, sb, "iptables-nft", "-t", "filter", "-N", "OTHER")
	require.True(t, ok, out)
	foreign := filepath.Join(e.pins, "someone-elses")
	require.NoError(t, os.Mkdir(foreign, 0o700))

	code, _, logs := run(t, append([]string{"--cleanup", "--netns", sb.Node.NSName, "--log-format", "json"}, e.args()...)...)
	require.Equal(t, 0, code, logs)
	require.NoError(t, os.Remove(foreign))
	for b, left := range settled(t, sb, e) {
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
		if slices.Contains(ourBackends(), b) {
			assert.Equal(t, "cleanup: removed what the backend owns: <nil>", said[b], b)
		} else {
			// Not in this kernel: skipped, saying why.
			assert.Contains(t, said[b], "cleanup: backend skipped: ", b)
		}
	}

	// Without a pin path, nothing of the ebpf backend outlives its
	// process: skipped.
	code, _, logs = run(t, "--cleanup", "--netns", sb.Node.NSName)
	require.Equal(t, 0, code, logs)
	assert.Contains(t, logs, `msg="cleanup: backend skipped" backend=ebpf reason="ebpf: cleanup: nothing of the backend can be there: no --bpf-pin-path, so its hooks leave with its process"`)
}

// kproxy removes the rules of the backend that ran before it, as
// kube-proxy removes its other modes' rules, once its own first sync is
// in; traffic flows through the new backend. The ebpf backend keeps the
// nftables table, its packet path, and the nftables backend adopts it.
func TestSwitchBackend(t *testing.T) {
	sb := newSandbox(t)
	e := newBPFEnv(t)
	// userspace first: its listeners end with its process (--once), so
	// no traffic is asked of it, but the addresses it held must go.
	order := append([]string{"userspace", "iptables"}, vmBackends...)
	order = append(order, "ebpf", "nftables")
	for i, b := range order {
		args := []string{"--source", "file", "--file", servicesFile(t), "--backend", b, "--once",
			"--netns", sb.Node.NSName, "--node-name", "node", "--node-ips", sandbox.NodeAddr.String(),
			"--healthz-bind-address=", "--health-check-node-ports=false"}
		code, _, logs := run(t, append(args, e.args()...)...)
		require.Equal(t, 0, code, logs)
		keep := append([]string{b}, backendUses(b)...)
		have := settled(t, sb, e, keep...)
		assert.True(t, have[b], "%s: its rules are in", b)
		if i > 0 {
			assert.False(t, have[order[i-1]], "%s: %s's rules left", b, order[i-1])
		}
		for other, left := range have {
			assert.False(t, left && !slices.Contains(keep, other), "%s: %s's objects there", b, other)
		}
		if b == "userspace" {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := sb.Eventually(ctx, "http://10.96.0.11:80/", 3, func(c sandbox.Counts) bool { return c["backend-1"] == 3 })
		cancel()
		assert.NoError(t, err, "%s: traffic to the cluster IP", b)
	}
}

// backendUses names the backends whose objects b holds as its own.
func backendUses(b string) []string {
	if b == "ebpf" {
		return []string{"nftables"}
	}
	return nil
}
