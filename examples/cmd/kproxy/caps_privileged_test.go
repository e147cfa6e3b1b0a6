//go:build privileged || vm

package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
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
// programs, as deploy/ grants them (setpriv's names; TestBackendCapsAreDeployed
// holds them to the manifests).
var backendCaps = map[string][]string{
	"nftables":  {"net_admin"},
	"iptables":  {"net_admin"},
	"ipvs":      {"net_admin"},
	"ebpf":      {"net_admin", "bpf", "sys_ptrace"},
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
			file := servicesFile(t)
			args := []string{"--source", "file", "--file", file, "--backend", backend,
				"--node-name", "node", "--node-ips", sandbox.NodeAddr.String(), "--metrics-bind-address="}
			var bpf bpfEnv
			if backend == "ebpf" {
				bpf = newBPFEnv(t)
				args = append(args, bpf.args()...)
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
			if backend == "ebpf" {
				staleSocketMoves(t, sb, bpf, file)
			}
			require.NoError(t, cmd.Process.Signal(os.Interrupt))
			require.NoError(t, cmd.Wait(), logs.String())
			assert.NotContains(t, logs.String(), "CAP_", "a capability is missing")
			assert.NotContains(t, logs.String(), "not permitted", "a capability is missing")

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

// staleSocketMoves: a connected UDP socket of a process in the ebpf
// backend's cgroup, in another network namespace than the node's (a
// pod's, here the client's), that the hooks sent to an endpoint, reaches
// another endpoint once its endpoint leaves the service (file, which
// kproxy follows): kproxy moves it with the capabilities it runs with.
func staleSocketMoves(t *testing.T, sb *sandbox.Sandbox, bpf bpfEnv, file string) {
	t.Helper()
	// Two endpoints: the backend, and the node itself.
	eps := []*sandbox.Host{sb.Backends[0], sb.Node}
	for _, h := range eps {
		serveUDPName(t, h, 8053)
	}
	service := func(hosts ...*sandbox.Host) string {
		s := "\n  - name: demo/dns\n    clusterIPs: [10.96.0.53]\n    ports:\n      - {name: dns, protocol: UDP, port: 53, targetPort: 8053}\n    endpoints:\n"
		for _, h := range hosts {
			s += "      - addr: " + h.Addr.String() + "\n"
		}
		return string(exampleServices) + s
	}
	write := func(content string) {
		t.Helper()
		tmp := file + ".new"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o644))
		require.NoError(t, os.Rename(tmp, file))
	}
	write(service(eps...))
	// The socket is the cgroup's while it is made, and its process is
	// there while kproxy looks for it.
	back, err := bpf.env.Enter()
	require.NoError(t, err)
	defer func() { require.NoError(t, back()) }()
	var c *net.UDPConn
	ask := func() (string, error) {
		if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
			return "", err
		}
		if _, err := c.Write([]byte("who")); err != nil {
			return "", err
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	deadline := time.Now().Add(30 * time.Second)
	var first string
	for {
		require.NoError(t, sandbox.In(sb.Client.NS, func() (err error) {
			c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.96.0.53:53")))
			return err
		}))
		first, err = ask()
		if err == nil {
			break
		}
		c.Close()
		require.True(t, time.Now().Before(deadline), "the UDP service never answered: %v", err)
		time.Sleep(100 * time.Millisecond)
	}
	defer c.Close()
	var stays *sandbox.Host
	for _, h := range eps {
		if h.Name != first {
			stays = h
		}
	}
	require.NotNil(t, stays, "answered by %q", first)
	write(service(stays))
	for {
		got, err := ask()
		if err == nil && got == stays.Name {
			return
		}
		require.True(t, time.Now().Before(deadline), "the socket still reaches %s (last: %q, %v), not %s", first, got, err, stays.Name)
		time.Sleep(100 * time.Millisecond)
	}
}

// serveUDPName answers every datagram to h's address and port with h's
// name, until the test ends.
func serveUDPName(t *testing.T, h *sandbox.Host, port uint16) {
	t.Helper()
	var c *net.UDPConn
	require.NoError(t, sandbox.In(h.NS, func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(h.Addr, port)))
		return err
	}))
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte(h.Name), from)
		}
	}()
}
