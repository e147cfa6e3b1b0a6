// Command demo shows kproxy load-balancing real traffic, in a sandbox it
// builds and removes: network namespaces for a node, a client and three
// backend hosts that serve HTTP. It loads the bundled services file
// (services.yaml), programs it with the chosen backend inside the sandbox
// node, sends requests to the service's ClusterIP and NodePort, prints how
// they spread over the backends and the rules the kernel holds, removes one
// backend and shows the traffic shift, then tears everything down (on
// Ctrl-C too). It never touches the host's own network namespace.
//
// It needs root and nothing else (with --dry-run, not even root):
//
//	sudo go run ./examples/demo
//	go run ./examples/demo --dry-run
package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kproxy-dev/kproxy/ebpf/ebpftest"
	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/servicelb"
)

//go:embed services.yaml
var servicesYAML []byte

// options are the demo's own flags.
type options struct {
	requests int
	services string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var cfg agent.Config
	cfg.RegisterFlags(fs)
	var o options
	fs.IntVar(&o.requests, "requests", 300, "requests to send to each address")
	fs.StringVar(&o.services, "services", "", "services file to load instead of the bundled one")
	fs.Usage = func() {
		fmt.Fprint(errOut, "demo: load-balance real traffic in a throwaway sandbox of network namespaces\n"+
			"(a node, a client, three HTTP backends), then tear it down. Needs root unless --dry-run.\n\n"+
			"Usage: sudo go run ./examples/demo [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfg.LogLevel == "info" {
		cfg.LogLevel = "warn" // keep the demo's output to its tables
	}
	log, err := cfg.Logger()
	if err != nil {
		fmt.Fprintln(errOut, "demo:", err)
		return 2
	}
	if err := demo(ctx, cfg, o, out, log); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(errOut, "demo: interrupted")
			return 130
		}
		fmt.Fprintln(errOut, "demo:", err)
		return 1
	}
	return 0
}

// sandboxNode sets what the agent flags say about the sandbox's node.
func sandboxNode(cfg *agent.Config) {
	cfg.NodeName = "node"
	cfg.NodeIPs = sandbox.NodeAddr.String()
	cfg.MinSyncInterval = 10 * time.Millisecond
}

func loadServices(o options) ([]servicelb.Service, string, error) {
	name, data := "services.yaml (bundled)", servicesYAML
	if o.services != "" {
		var err error
		if data, err = os.ReadFile(o.services); err != nil {
			return nil, "", err
		}
		name = o.services
	}
	p, err := filesource.Parse(name, data)
	if err != nil {
		return nil, "", err
	}
	for _, e := range p.Bad {
		return nil, "", e
	}
	return p.Services, name, nil
}

func demo(ctx context.Context, cfg agent.Config, o options, out io.Writer, log *slog.Logger) error {
	svcs, file, err := loadServices(o)
	if err != nil {
		return err
	}
	sandboxNode(&cfg)
	if err := agent.Available(cfg.Backend); err != nil {
		return err
	}
	if cfg.DryRun {
		return dryRun(ctx, cfg, svcs, out, log)
	}
	if err := sandbox.CheckRoot(); err != nil {
		return fmt.Errorf("%w\nrun it as root, e.g. sudo go run ./examples/demo (or --dry-run to only print the rules)", err)
	}
	closeEnv, env, err := socketEnv(&cfg)
	if err != nil {
		return err
	}
	defer closeEnv()
	fmt.Fprintf(out, "Building a sandbox: namespaces for a node, a client and 3 backends ...\n")
	sb, err := sandbox.New(sandbox.Options{Backends: 3, Logger: log, RequestTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintf(out, "\nTearing down: rules, servers and namespaces ... ")
		if err := sb.Close(); err != nil {
			fmt.Fprintf(out, "%v\n", err)
			return
		}
		fmt.Fprintln(out, "done.")
	}()
	for _, b := range sb.Backends {
		if err := b.ServeHTTP(8080); err != nil {
			return err
		}
	}
	describe(out, sb, svcs, file)
	cfg.NetNS, cfg.CleanupOnExit = sb.Node.NSName, true
	return drive(ctx, cfg, o, sb, env, svcs, out, log)
}

func describe(out io.Writer, sb *sandbox.Sandbox, svcs []servicelb.Service, file string) {
	var backends []string
	for _, b := range sb.Backends {
		backends = append(backends, fmt.Sprintf("%s %s:8080", b.Name, b.Addr))
	}
	fmt.Fprintf(out, "  node %s (namespace %s), client %s\n  %s\n", sb.Node.Addr, sb.Node.NSName, sb.Client.Addr, strings.Join(backends, ", "))
	fmt.Fprintf(out, "Services from %s:\n", file)
	for _, s := range svcs {
		for _, p := range s.Ports {
			fmt.Fprintf(out, "  %s %s/%d", s.Name, strings.ToLower(string(p.Protocol)), p.Port)
			for _, ip := range s.ClusterIPs {
				fmt.Fprintf(out, "  ClusterIP %s:%d", ip, p.Port)
			}
			if p.NodePort != 0 {
				fmt.Fprintf(out, "  NodePort %d", p.NodePort)
			}
			fmt.Fprintf(out, "  -> %d endpoints\n", len(s.Endpoints))
		}
	}
}

// dryRun prints the rules the backend would install, and exits.
func dryRun(ctx context.Context, cfg agent.Config, svcs []servicelb.Service, out io.Writer, log *slog.Logger) error {
	cfg.Once = true
	a, err := agent.New(agent.Options{Config: cfg, Logger: log, Stdout: out})
	if err != nil {
		return err
	}
	defer a.Close()
	src := a.Runner().Source("demo")
	if err := src.Replace(svcs); err != nil {
		return err
	}
	src.Synced()
	return a.Run(ctx)
}

// drive runs the agent on the sandbox node and walks through the demo.
func drive(ctx context.Context, cfg agent.Config, o options, sb *sandbox.Sandbox, env *ebpftest.Env, svcs []servicelb.Service, out io.Writer, log *slog.Logger) error {
	a, err := agent.New(agent.Options{Config: cfg, Logger: log, Stdout: out})
	if err != nil {
		return err
	}
	defer a.Close()
	src := a.Runner().Source("demo")
	if err := src.Replace(svcs); err != nil {
		return err
	}
	src.Synced()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(out, "agent:", err)
		}
	}()
	if err := waitApplied(ctx, a); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nProgrammed with the %s backend.\n", cfg.Backend)
	if err := traffic(ctx, out, sb, svcs, o.requests); err != nil {
		return err
	}
	if err := nodeTraffic(ctx, out, env, sb, svcs, o.requests); err != nil {
		return err
	}
	if err := showRules(ctx, out, a, cfg.Backend, sb, svcs); err != nil {
		return err
	}
	return shift(ctx, out, a, src, sb, svcs, o.requests)
}

// waitApplied waits until the runner has applied its whole desired state.
func waitApplied(ctx context.Context, a *agent.Agent) error {
	r := a.Runner()
	for {
		h := r.Health()
		if r.Applied() != nil && r.Applied() == r.State() {
			return nil
		}
		if h.LastError != nil {
			return h.LastError
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// target is one address the demo sends requests to.
type target struct {
	label, url string
}

func targets(svcs []servicelb.Service) []target {
	var out []target
	if len(svcs) == 0 || len(svcs[0].Ports) == 0 {
		return out
	}
	s, p := svcs[0], svcs[0].Ports[0]
	for _, ip := range s.ClusterIPs {
		out = append(out, target{"ClusterIP " + fmt.Sprintf("%s:%d", ip, p.Port), fmt.Sprintf("http://%s:%d/", ip, p.Port)})
	}
	if p.NodePort != 0 {
		out = append(out, target{fmt.Sprintf("NodePort %s:%d", sandbox.NodeAddr, p.NodePort), fmt.Sprintf("http://%s:%d/", sandbox.NodeAddr, p.NodePort)})
	}
	return out
}

// traffic sends n requests to each target of the first service and prints
// a table of answers per backend.
func traffic(ctx context.Context, out io.Writer, sb *sandbox.Sandbox, svcs []servicelb.Service, n int) error {
	ts := targets(svcs)
	var counts []sandbox.Counts
	for _, t := range ts {
		c, err := sb.Distribute(ctx, t.url, n)
		if err != nil {
			return err
		}
		counts = append(counts, c)
	}
	fmt.Fprintf(out, "\n%d requests from the client (a new connection each) to %s:\n", n, svcs[0].Name)
	fmt.Fprintf(out, "  %-11s", "answered by")
	for _, t := range ts {
		fmt.Fprintf(out, "  %24s", t.label)
	}
	fmt.Fprintln(out)
	rows := []string{}
	for _, b := range sb.Backends {
		rows = append(rows, b.Name)
	}
	for _, c := range counts {
		if c["error"] > 0 && !slices.Contains(rows, "error") {
			rows = append(rows, "error")
		}
	}
	for _, row := range rows {
		fmt.Fprintf(out, "  %-11s", row)
		for _, c := range counts {
			fmt.Fprintf(out, "  %24d", c[row])
		}
		fmt.Fprintln(out)
	}
	return nil
}

// shift removes the second endpoint of the first service and shows the
// traffic move to the others.
func shift(ctx context.Context, out io.Writer, a *agent.Agent, src *servicelb.Source, sb *sandbox.Sandbox, svcs []servicelb.Service, n int) error {
	if len(svcs) == 0 || len(svcs[0].Endpoints) < 2 {
		return nil
	}
	next := slices.Clone(svcs)
	web := next[0]
	gone := web.Endpoints[1]
	web.Endpoints = slices.Delete(slices.Clone(web.Endpoints), 1, 2)
	next[0] = web
	fmt.Fprintf(out, "\nRemoving endpoint %s from %s ...\n", gone.Addr, web.Name)
	start := time.Now()
	if err := src.Replace(next); err != nil {
		return err
	}
	if err := waitApplied(ctx, a); err != nil {
		return err
	}
	fmt.Fprintf(out, "  applied in %s\n", time.Since(start).Round(time.Millisecond))
	return traffic(ctx, out, sb, next, n)
}
