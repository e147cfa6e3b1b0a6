// Package agent is what the example node agents share: their common flags,
// the choice of dataplane backend with a probe of the kernel's support,
// dry runs, Prometheus metrics and /healthz, logging, and the run loop that
// drives a servicelb.Runner from the agent's sources until a signal.
package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Config holds the flags every agent shares.
type Config struct {
	// Backend is the dataplane: nftables, iptables, ipvs or userspace.
	Backend string
	// DryRun prints the rules each sync would install instead of
	// installing them.
	DryRun bool
	// Once exits after the first successful sync.
	Once bool
	// Cleanup removes the backend's rules on exit.
	Cleanup bool
	// NetNS is the network namespace to program: a name in /run/netns
	// or a path; empty means the agent's own.
	NetNS string
	// MetricsAddr, when set, serves /metrics and /healthz there.
	MetricsAddr string
	// HealthzTimeout is how long a change may wait before /healthz fails.
	HealthzTimeout time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel string

	NodeName          string
	Zone              string
	NodeIPs           string
	NodePortAddresses string
	NodePortRange     string
	ClusterCIDRs      string
	ServiceCIDRs      string
	MasqueradeAll     bool

	MinSyncInterval time.Duration
	MaxSyncInterval time.Duration
}

// RegisterFlags defines the shared flags on fs, with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Backend, "backend", "nftables", "dataplane backend: nftables, iptables, ipvs or userspace")
	fs.BoolVar(&c.DryRun, "dry-run", false, "print the rules each sync would install, and touch nothing")
	fs.BoolVar(&c.Once, "once", false, "exit after the first successful sync")
	fs.BoolVar(&c.Cleanup, "cleanup", false, "remove the installed rules on exit (by default they stay, so that a restart drops no traffic)")
	fs.StringVar(&c.NetNS, "netns", "", "network namespace to program: a name in /run/netns or a path (default: the agent's own)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics and /healthz on this address, e.g. 127.0.0.1:10249 (default: off)")
	fs.DurationVar(&c.HealthzTimeout, "healthz-timeout", time.Minute, "/healthz fails when a change has waited this long to be applied")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name: endpoints with this node name are local")
	fs.StringVar(&c.Zone, "zone", "", "this node's topology zone, for topology hints")
	fs.StringVar(&c.NodeIPs, "node-ips", "", "comma-separated node addresses that serve node ports")
	fs.StringVar(&c.NodePortAddresses, "nodeport-addresses", "", "comma-separated prefixes selecting the node IPs that serve node ports (default: all)")
	fs.StringVar(&c.NodePortRange, "nodeport-range", "30000-32767", "node port range, min-max")
	fs.StringVar(&c.ClusterCIDRs, "cluster-cidrs", "", "comma-separated prefixes of the workloads' addresses; other sources are masqueraded")
	fs.StringVar(&c.ServiceCIDRs, "service-cidrs", "", "comma-separated prefixes of every cluster IP; unknown ones are dropped")
	fs.BoolVar(&c.MasqueradeAll, "masquerade-all", false, "masquerade all traffic to cluster IPs")
	fs.DurationVar(&c.MinSyncInterval, "min-sync-interval", time.Second, "least time between two syncs; changes meanwhile are applied together")
	fs.DurationVar(&c.MaxSyncInterval, "max-sync-interval", servicelb.DefaultMaxSyncInterval, "most time between two syncs; each checks the kernel state in depth and restores it")
}

// Node returns the NodeConfig the flags describe.
func (c *Config) Node() (servicelb.NodeConfig, error) {
	var n servicelb.NodeConfig
	var errs []error
	n.NodeName, n.Zone, n.MasqueradeAll = c.NodeName, c.Zone, c.MasqueradeAll
	for _, s := range splitList(c.NodeIPs) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-ips: %w", err))
			continue
		}
		n.NodeIPs = append(n.NodeIPs, a)
	}
	var err error
	if n.NodePortAddresses, err = parsePrefixes("nodeport-addresses", c.NodePortAddresses); err != nil {
		errs = append(errs, err)
	}
	if n.ClusterCIDRs, err = parsePrefixes("cluster-cidrs", c.ClusterCIDRs); err != nil {
		errs = append(errs, err)
	}
	if n.ServiceCIDRs, err = parsePrefixes("service-cidrs", c.ServiceCIDRs); err != nil {
		errs = append(errs, err)
	}
	if n.NodePortRange, err = parseRange(c.NodePortRange); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return n, err
	}
	if err := servicelb.ValidateNode(&n); err != nil {
		return n, fmt.Errorf("node flags: %w", err)
	}
	return n, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parsePrefixes(flagName, s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var errs []error
	for _, f := range splitList(s) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s: %w", flagName, err))
			continue
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

func parseRange(s string) (servicelb.PortRange, error) {
	if s == "" {
		return servicelb.PortRange{}, nil
	}
	var r servicelb.PortRange
	if _, err := fmt.Sscanf(s, "%d-%d", &r.Min, &r.Max); err != nil || r.Min == 0 || r.Min > r.Max {
		return r, fmt.Errorf("--nodeport-range %q: want min-max, such as 30000-32767", s)
	}
	return r, nil
}

// Logger returns a text logger on stderr at the configured level.
func (c *Config) Logger() (*slog.Logger, error) { return c.LoggerTo(os.Stderr) }

// LoggerTo returns a text logger on w at the configured level.
func (c *Config) LoggerTo(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: lvl})), nil
}

// RunnerOptions returns the servicelb.RunnerOptions the flags describe.
func (c *Config) RunnerOptions(node servicelb.NodeConfig) servicelb.RunnerOptions {
	return servicelb.RunnerOptions{
		Node:            node,
		MinSyncInterval: c.MinSyncInterval,
		MaxSyncInterval: c.MaxSyncInterval,
	}
}
