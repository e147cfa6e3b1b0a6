//go:build privileged || vm

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
)

// backendCaps are the capabilities each backend needs in the namespace it
// programs, as deploy/ and the README state them (setpriv's names).
var backendCaps = map[string][]string{
	"nftables":  {"net_admin"},
	"iptables":  {"net_admin"},
	"ipvs":      {"net_admin"},
	"ebpf":      {"net_admin", "bpf"},
	"userspace": {"net_admin", "net_bind_service"},
}

// asKproxyEnv, in the environment of this test binary, makes
// TestCapabilities run kproxy with the arguments it holds (one a line)
// and exit with its code: the binary the test starts under setpriv, in
// the VM too, where no Go toolchain builds the real one.
const asKproxyEnv = "KPROXY_CMD_TEST_AS_KPROXY"

// TestCapabilities: with the capabilities the deployment grants a backend
// and no other (root's bounding set cut down to them, as the DaemonSet and
// the systemd unit do), kproxy programs its namespace, traffic flows and
// its health is served; with any one of them missing it says which. The
// VM runs it for ipvs, whose kernel support the host lacks.
func TestCapabilities(t *testing.T) {
	if args, ok := os.LookupEnv(asKproxyEnv); ok {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := program().Run(ctx, strings.Split(args, "\n"), os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	for _, backend := range capsBackends {
		t.Run(backend, func(t *testing.T) {
			caps := backendCaps[backend]
			require.NotEmpty(t, caps)
			sb := newSandbox(t)
			args := []string{"--source", "file", "--file", servicesFile(t), "--backend", backend,
				"--node-name", "node", "--node-ips", sandbox.NodeAddr.String(), "--metrics-bind-address="}
			if backend == "ebpf" {
				args = append(args, newBPFEnv(t).args()...)
			} else {
				args = append(args, "--bpf-pin-path=")
			}

			cmd, logs := startWithCaps(t, sb, caps, args)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := sb.Eventually(ctx, "http://10.96.0.11:80/", 3, func(c sandbox.Counts) bool { return c["backend-1"] == 3 })
			require.NoError(t, err, "traffic through the rules: %s", logs)
			// Healthy once the first sync is whole: IPVS, which is not
			// transactional, carries traffic before its helper rules and
			// sets are in.
			var health string
			for {
				health, err = sb.Get(ctx, "http://"+sandbox.NodeAddr.String()+":10256/healthz")
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			require.NoError(t, err, logs.String())
			assert.Contains(t, health, `"healthy":true`)
			if backend == "ipvs" {
				// Written with CAP_NET_ADMIN alone: root owns /proc/sys.
				var v []byte
				require.NoError(t, sandbox.In(sb.Node.NS, func() (err error) {
					v, err = os.ReadFile("/proc/sys/net/ipv4/vs/conntrack")
					return err
				}))
				assert.Equal(t, "1\n", string(v))
			}
			require.NoError(t, cmd.Process.Signal(os.Interrupt))
			require.NoError(t, cmd.Wait(), logs.String())
			assert.NotContains(t, logs.String(), "CAP_", "a capability is missing")

			for _, c := range caps {
				fewer := slices.DeleteFunc(slices.Clone(caps), func(x string) bool { return x == c })
				cmd, logs := startWithCaps(t, sb, fewer, append(args, "--once"))
				err := waitFor(cmd, time.Minute)
				name := "CAP_" + strings.ToUpper(c)
				assert.Contains(t, logs.String(), name, "without %s (exit: %v)", name, err)
			}
		})
	}
}

// startWithCaps starts kproxy with args in the sandbox node's namespace
// (where it serves its health on the default address), as root whose
// bounding set holds caps alone: what it may have.
func startWithCaps(t *testing.T, sb *sandbox.Sandbox, caps, args []string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	var logs bytes.Buffer
	cmd := exec.Command("setpriv", "--bounding-set", set, "--inh-caps", "-all", "--", os.Args[0], "-test.run=^TestCapabilities$")
	cmd.Env = append(os.Environ(), asKproxyEnv+"="+strings.Join(args, "\n"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, sandbox.In(sb.Node.NS, cmd.Start))
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &logs
}

// waitFor waits for cmd to exit, and stops it after d.
func waitFor(cmd *exec.Cmd, d time.Duration) error {
	t := time.AfterFunc(d, func() { _ = cmd.Process.Signal(os.Interrupt) })
	defer t.Stop()
	return cmd.Wait()
}
