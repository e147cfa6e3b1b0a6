package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// socketEnv gives the ebpf backend what it attaches to in the sandbox: a
// private cgroup v2 mount with a cgroup of the demo's own, and a private
// bpf filesystem for its pins, removed with the sandbox. Other backends
// need none: it returns a no-op.
func socketEnv(cfg *agent.Config) (func() error, *ebpftest.Env, error) {
	if cfg.Backend != "ebpf" {
		// No pins, so that the removal of the other backends' objects
		// after the first sync never looks at the host's bpf filesystem.
		cfg.BPFPinPath = ""
		return func() error { return nil }, nil, nil
	}
	e, err := ebpftest.New("kproxy-demo")
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
func nodeTraffic(ctx context.Context, out io.Writer, e *ebpftest.Env, sb *sandbox.Sandbox, svcs []servicelb.Service, n int) error {
	if e == nil || len(svcs) == 0 || len(svcs[0].ClusterIPs) == 0 || len(svcs[0].Ports) == 0 {
		return nil
	}
	back, err := e.Enter()
	if err != nil {
		return fmt.Errorf("enter the hooks' cgroup: %w", err)
	}
	defer back()
	s, p := svcs[0], svcs[0].Ports[0]
	url := fmt.Sprintf("http://%s:%d/", s.ClusterIPs[0], p.Port)
	c := sb.Node.HTTPClient(2 * time.Second)
	counts := sandbox.Counts{}
	for range n {
		name, err := sandbox.GetWith(ctx, c, url)
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
