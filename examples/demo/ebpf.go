package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/internal/bpfenv"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// socketEnv gives the ebpf backend what it attaches to in the sandbox: a
// private cgroup v2 mount with a cgroup of the demo's own, and a private
// bpf filesystem for its pins, removed with the sandbox. Other backends
// need none: it returns a no-op.
func socketEnv(cfg *agent.Config) (func() error, *bpfenv.Env, error) {
	if cfg.Backend != "ebpf" {
		return func() error { return nil }, nil, nil
	}
	e, err := bpfenv.New("kproxy-demo")
	if err != nil {
		return nil, nil, err
	}
	cfg.Cgroup, cfg.BPFPinPath = e.Cgroup, filepath.Join(e.BPFFS, "kproxy")
	if cfg.ClusterCIDRs == "" {
		// The backends' subnets: with cluster CIDRs the node's own
		// traffic to a cluster IP is masqueraded, which the hooks give by
		// connecting the node's socket to the endpoint itself.
		var cidrs []string
		for i := 1; i <= 3; i++ {
			cidrs = append(cidrs, netip.PrefixFrom(sandbox.BackendAddr(i), 24).Masked().String())
		}
		cfg.ClusterCIDRs = strings.Join(cidrs, ",")
	}
	return e.Close, e, nil
}

// nodeTraffic sends n requests to the first service's cluster IP from the
// node's own sockets, with the demo's process inside the hooks' cgroup
// for the time, and prints who answered: the socket hooks send each
// connection straight to an endpoint.
func nodeTraffic(ctx context.Context, out io.Writer, e *bpfenv.Env, sb *sandbox.Sandbox, svcs []servicelb.Service, n int) error {
	if e == nil || len(svcs) == 0 || len(svcs[0].ClusterIPs) == 0 || len(svcs[0].Ports) == 0 {
		return nil
	}
	back, err := enter(e)
	if err != nil {
		return err
	}
	defer back()
	s, p := svcs[0], svcs[0].Ports[0]
	url := fmt.Sprintf("http://%s:%d/", s.ClusterIPs[0], p.Port)
	c := sb.Node.HTTPClient(2 * time.Second)
	counts := sandbox.Counts{}
	for range n {
		name, err := getBody(ctx, c, url)
		if err != nil {
			name = "error"
		}
		counts[name]++
	}
	fmt.Fprintf(out, "\n%d requests from the node's own sockets (in the hooks' cgroup) to %s: ", n, url)
	var parts []string
	for _, b := range sb.Backends {
		parts = append(parts, fmt.Sprintf("%s %d", b.Name, counts[b.Name]))
	}
	if counts["error"] > 0 {
		parts = append(parts, fmt.Sprintf("error %d", counts["error"]))
	}
	fmt.Fprintln(out, strings.Join(parts, ", "))
	return nil
}

// enter moves the demo's process into the cgroup and returns how to move
// it back.
func enter(e *bpfenv.Env) (func(), error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var home string
	for _, line := range strings.Split(string(self), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			home = filepath.Join(e.Root, p)
		}
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(e.Cgroup, "cgroup.procs"), pid, 0o644); err != nil {
		return nil, fmt.Errorf("enter the hooks' cgroup: %w", err)
	}
	return func() { _ = os.WriteFile(filepath.Join(home, "cgroup.procs"), pid, 0o644) }, nil
}

// getBody sends one GET and returns the body without its trailing
// newline: the name of the backend that answered.
func getBody(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return strings.TrimSpace(string(b)), err
}
