package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Program is one agent binary: its help text, its own flags and its
// sources.
type Program struct {
	// Name is the binary's name.
	Name string
	// Usage is the help text above the flags: what the agent does and
	// needs.
	Usage string
	// Flags registers the agent's own flags.
	Flags func(fs *flag.FlagSet)
	// Sources returns the agent's sources once the flags are parsed.
	Sources func(log *slog.Logger) ([]Source, error)
	// NodeCIDRs, when set, returns the pod CIDRs of the named node from
	// where the agent's sources know them (the Kubernetes agent reads its
	// Node's spec.podCIDRs). It is asked, after Sources, under
	// --detect-local-mode=NodeCIDR without --node-cidrs.
	NodeCIDRs func(ctx context.Context, node string) ([]netip.Prefix, error)
}

// Main runs the program with the process's arguments until SIGINT or
// SIGTERM, and exits: 0 on success, 1 on error, 2 on bad flags.
func Main(p Program) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run runs the program with args until ctx ends and returns its exit code;
// logs go to errOut.
func (p Program) Run(ctx context.Context, args []string, stdout, errOut io.Writer) int {
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	fs.SetOutput(errOut)
	var cfg Config
	cfg.RegisterFlags(fs)
	if p.Flags != nil {
		p.Flags(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(errOut, "%s\n\nUsage: %s [flags]\n\nFlags:\n", p.Usage, p.Name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "%s: unexpected arguments %q\n", p.Name, fs.Args())
		return 2
	}
	log, err := cfg.LoggerTo(errOut)
	if err != nil {
		fmt.Fprintf(errOut, "%s: %v\n", p.Name, err)
		return 2
	}
	if err := p.start(ctx, cfg, log, stdout); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}

func (p Program) start(ctx context.Context, cfg Config, log *slog.Logger, stdout io.Writer) error {
	sources, err := p.Sources(log)
	if err != nil {
		return err
	}
	if err := p.nodeCIDRs(ctx, &cfg, log); err != nil {
		return err
	}
	a, err := New(Options{Config: cfg, Logger: log, Stdout: stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	log.Info("starting", "backend", cfg.Backend, "dryRun", cfg.DryRun, "netns", cfg.NetNS)
	return a.Run(ctx, sources...)
}

// nodeCIDRs fills --node-cidrs from the program's NodeCIDRs when the
// detection needs them and the flag does not give them.
func (p Program) nodeCIDRs(ctx context.Context, cfg *Config, log *slog.Logger) error {
	if p.NodeCIDRs == nil || cfg.DetectLocalMode != string(servicelb.LocalByNodeCIDR) || cfg.NodeCIDRs != "" {
		return nil
	}
	if cfg.NodeName == "" {
		return fmt.Errorf("--detect-local-mode=%s: --node-name names the node whose pod CIDRs to read (or give --node-cidrs)", servicelb.LocalByNodeCIDR)
	}
	cidrs, err := p.NodeCIDRs(ctx, cfg.NodeName)
	if err != nil {
		return fmt.Errorf("pod CIDRs of node %s: %w", cfg.NodeName, err)
	}
	texts := make([]string, len(cidrs))
	for i, c := range cidrs {
		texts[i] = c.String()
	}
	cfg.NodeCIDRs = strings.Join(texts, ",")
	log.Info("node pod CIDRs", "node", cfg.NodeName, "cidrs", cfg.NodeCIDRs)
	return nil
}
