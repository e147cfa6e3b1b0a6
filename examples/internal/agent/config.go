// Package agent is what the example node agents share: their common flags,
// the choice of dataplane backend with a probe of the kernel's support,
// dry runs, Prometheus metrics (kube-proxy's among them) and /healthz,
// the proxy's health server and the services' health check node ports
// (package healthcheck), logging, and the run loop that drives a
// servicelb.Runner from the agent's sources until a signal.
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

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/healthcheck"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Config holds the flags every agent shares.
type Config struct {
	// Backend is the dataplane: nftables, iptables, ipvs, ebpf or userspace.
	Backend string
	// Cgroup is the cgroup v2 directory the ebpf backend attaches its
	// socket hooks to: the root of the workloads' cgroups.
	Cgroup string
	// BPFPinPath is the directory on a bpf filesystem where the ebpf
	// backend pins its maps and hooks, so that a restart adopts them.
	BPFPinPath string
	// DryRun prints the rules each sync would install instead of
	// installing them.
	DryRun bool
	// Once exits after the first sync, successful or not: Run returns
	// its error (a failed sync is not retried).
	Once bool
	// CleanupOnExit removes the backend's rules when Run returns (by
	// default they stay, so that a restart drops no traffic).
	CleanupOnExit bool
	// NetNS is the network namespace to program: a name in /run/netns
	// or a path; empty means the agent's own.
	NetNS string
	// MetricsAddr, when set, serves /metrics and /healthz there.
	MetricsAddr string
	// Profiling serves Go's profiles (/debug/pprof/) on MetricsAddr too.
	Profiling bool
	// HealthzBindAddress, when set, serves the proxy's /healthz and
	// /livez there, in NetNS, as kube-proxy's --healthz-bind-address.
	HealthzBindAddress string
	// HealthzTimeout is how long a change may wait before the proxy is
	// unhealthy; zero means twice MaxSyncInterval (HealthTimeout).
	HealthzTimeout time.Duration
	// ServiceHealthChecks serves the health check node port of every
	// service that has one, in NetNS, on the node-port addresses.
	ServiceHealthChecks bool
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// LogFormat is text (the default) or json.
	LogFormat string

	NodeName          string
	Zone              string
	NodeIPs           string
	NodePortAddresses string
	NodePortRange     string
	ClusterCIDRs      string
	ServiceCIDRs      string
	MasqueradeAll     bool
	// MasqueradeBit is the packet mark bit (1-31) that tags traffic for
	// masquerade.
	MasqueradeBit      int
	LocalhostNodePorts bool
	// StrictARP keeps the node from answering ARP for the addresses the
	// ipvs and userspace backends hold, on its other links
	// (ipvs.Options.StrictARP, userspace.Options.StrictARP).
	StrictARP bool
	// DetectLocalMode and its parameters say how the node tells its pods'
	// traffic from outside traffic (servicelb.DetectLocal), with
	// kube-proxy's flag names.
	DetectLocalMode        string
	NodeCIDRs              string
	PodBridgeInterface     string
	PodInterfaceNamePrefix string

	// Conntrack is kube-proxy's conntrack tuning, applied at start in
	// NetNS; the zero value writes nothing.
	Conntrack conntrack.Tuning

	// Userspace are the userspace backend's settings.
	Userspace UserspaceFlags

	MinSyncInterval time.Duration
	MaxSyncInterval time.Duration
}

// RegisterFlags defines the shared flags on fs, with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Backend, "backend", "nftables", "dataplane backend: nftables, iptables, ipvs, ebpf (socket hooks paired with nftables) or userspace (listeners, no rules)")
	fs.StringVar(&c.Cgroup, "cgroup", "", "ebpf: the cgroup v2 directory whose processes' sockets are balanced (the root of the workloads' cgroups)")
	fs.StringVar(&c.BPFPinPath, "bpf-pin-path", "/sys/fs/bpf/kproxy", "ebpf: directory on a bpf filesystem for the maps and hooks, adopted on restart (empty: no pins)")
	fs.BoolVar(&c.DryRun, "dry-run", false, "print the rules each sync would install, and touch nothing")
	fs.BoolVar(&c.Once, "once", false, "exit after the first sync: status 0 if it succeeded, 1 with its error if it failed (no retry)")
	fs.StringVar(&c.NetNS, "netns", "", "network namespace to program: a name in /run/netns or a path (default: the agent's own)")
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", healthcheck.DefaultAddr, "serve the proxy's /healthz and /livez on this address, in the --netns namespace, as kube-proxy; empty turns it off")
	fs.DurationVar(&c.HealthzTimeout, "healthz-timeout", 0, "the proxy is unhealthy when a change has waited this long to be applied (default: twice --max-sync-interval)")
	fs.BoolVar(&c.ServiceHealthChecks, "health-check-node-ports", true, "serve the health check node port of each service that has one (externalTrafficPolicy: Local), in the --netns namespace, on the node-port addresses")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name: endpoints with this node name are local (with kproxy's kubernetes source, the hostname by default)")
	fs.StringVar(&c.Zone, "zone", "", "this node's topology zone, for topology hints")
	fs.StringVar(&c.NodeIPs, "node-ips", "", "comma-separated primary addresses of the node (a Kubernetes Node's addresses)")
	fs.StringVar(&c.NodePortAddresses, "nodeport-addresses", "", `comma-separated CIDRs selecting the local addresses that serve node ports (a family without one: every address of it), or "primary" alone for the --node-ips (default: every local address, followed as interfaces change)`)
	fs.BoolVar(&c.LocalhostNodePorts, "localhost-nodeports", false, "serve node ports on 127.0.0.1 too, as kube-proxy's iptables mode, while --nodeport-addresses holds the loopback network (iptables and userspace backends; iptables sets route_localnet)")
	fs.IntVar(&c.Conntrack.MaxPerCore, "conntrack-max-per-core", 0, "set nf_conntrack_max to this many per CPU (kube-proxy: 32768); 0 leaves it alone")
	fs.IntVar(&c.Conntrack.Min, "conntrack-min", 0, "with --conntrack-max-per-core, the least nf_conntrack_max (kube-proxy: 131072)")
	fs.DurationVar(&c.Conntrack.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", 0, "set the conntrack timeout of established TCP flows (kube-proxy: 24h); 0 leaves it alone")
	fs.DurationVar(&c.Conntrack.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", 0, "set the conntrack timeout of TCP flows in CLOSE_WAIT (kube-proxy: 1h); 0 leaves it alone")
	fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "set nf_conntrack_tcp_be_liberal: out-of-window TCP packets are not marked invalid")
	fs.DurationVar(&c.Conntrack.UDPTimeout, "conntrack-udp-timeout", 0, "set the conntrack timeout of UDP flows; 0 leaves it alone")
	fs.DurationVar(&c.Conntrack.UDPStreamTimeout, "conntrack-udp-timeout-stream", 0, "set the conntrack timeout of UDP streams; 0 leaves it alone")
	fs.StringVar(&c.NodePortRange, "nodeport-range", "", "refuse services with a node port outside this range, min-max (default: no range, as kube-proxy, which serves any node port the API server allocated)")
	fs.StringVar(&c.ClusterCIDRs, "cluster-cidrs", "", "comma-separated prefixes of the workloads' addresses; other sources are masqueraded")
	fs.StringVar(&c.ServiceCIDRs, "service-cidrs", "", "comma-separated prefixes of every cluster IP; unknown ones are dropped")
	fs.BoolVar(&c.MasqueradeAll, "masquerade-all", false, "masquerade all traffic to cluster IPs")
	fs.IntVar(&c.MasqueradeBit, "masquerade-bit", 14, "the packet mark bit (1-31) that tags traffic for masquerade (kube-proxy's masqueradeBit)")
	fs.BoolVar(&c.StrictARP, "ipvs-strict-arp", false, "ipvs and userspace backends: set arp_ignore=1 and arp_announce=2, so that the node answers no ARP request for the service addresses they hold on its other links")
	fs.StringVar(&c.DetectLocalMode, "detect-local-mode", "", "how traffic from this node's pods is told apart: ClusterCIDR (the default: a source in --cluster-cidrs), "+
		"NodeCIDR (a source in --node-cidrs), BridgeInterface (it comes in on --pod-bridge-interface) or InterfaceNamePrefix "+
		"(it comes in on an interface named --pod-interface-name-prefix...); traffic from elsewhere to cluster IPs is masqueraded")
	fs.StringVar(&c.NodeCIDRs, "node-cidrs", "", "comma-separated pod CIDRs of this node, for --detect-local-mode=NodeCIDR")
	fs.StringVar(&c.PodBridgeInterface, "pod-bridge-interface", "", "the bridge this node's pods hang on, such as cbr0, for --detect-local-mode=BridgeInterface")
	fs.StringVar(&c.PodInterfaceNamePrefix, "pod-interface-name-prefix", "", "the start of the names of this node's interfaces to its pods, such as veth, for --detect-local-mode=InterfaceNamePrefix")
	c.Userspace.register(fs)
	fs.DurationVar(&c.MinSyncInterval, "min-sync-interval", time.Second, "least time between two syncs; changes meanwhile are applied together")
	fs.DurationVar(&c.MaxSyncInterval, "max-sync-interval", servicelb.DefaultMaxSyncInterval, "most time between two syncs; each checks the kernel state in depth and restores it")
}

// Node returns the NodeConfig the flags describe.
func (c *Config) Node() (servicelb.NodeConfig, error) {
	var n servicelb.NodeConfig
	var errs []error
	n.NodeName, n.Zone, n.MasqueradeAll, n.LocalhostNodePorts = c.NodeName, c.Zone, c.MasqueradeAll, c.LocalhostNodePorts
	switch {
	case c.MasqueradeBit == 0:
		// Unset in a Config built in code: the default.
	case c.MasqueradeBit < 1 || c.MasqueradeBit > 31:
		errs = append(errs, fmt.Errorf("--masquerade-bit %d: want 1 to 31", c.MasqueradeBit))
	default:
		n.MasqueradeBit = uint8(c.MasqueradeBit)
	}
	for _, s := range splitList(c.NodeIPs) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--node-ips: %w", err))
			continue
		}
		n.NodeIPs = append(n.NodeIPs, a)
	}
	var err error
	if n.NodePortAddresses, n.NodePortPrimary, err = servicelb.ParseNodePortAddresses(splitList(c.NodePortAddresses)); err != nil {
		errs = append(errs, fmt.Errorf("--nodeport-addresses: %w", err))
	}
	if n.ClusterCIDRs, err = parsePrefixes("cluster-cidrs", c.ClusterCIDRs); err != nil {
		errs = append(errs, err)
	}
	if n.ServiceCIDRs, err = parsePrefixes("service-cidrs", c.ServiceCIDRs); err != nil {
		errs = append(errs, err)
	}
	n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalMode(c.DetectLocalMode),
		BridgeInterface: c.PodBridgeInterface, InterfaceNamePrefix: c.PodInterfaceNamePrefix}
	if n.DetectLocal.NodeCIDRs, err = parsePrefixes("node-cidrs", c.NodeCIDRs); err != nil {
		errs = append(errs, err)
	}
	if n.NodePortRange, err = parseRange(c.NodePortRange); err != nil {
		errs = append(errs, err)
	}
	if err := c.Conntrack.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--conntrack-*: %w", err))
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

// Logger returns a logger on stderr at the configured level and format.
func (c *Config) Logger() (*slog.Logger, error) { return c.LoggerTo(os.Stderr) }

// LoggerTo returns a logger on w at the configured level, in the
// configured format: text (key=value) or JSON, one object a line.
func (c *Config) LoggerTo(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch c.LogFormat {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.LogFormat)
}

// HealthTimeout returns how long a change may wait to be applied before
// the proxy is unhealthy: --healthz-timeout, else twice
// --max-sync-interval.
func (c *Config) HealthTimeout() time.Duration {
	if c.HealthzTimeout > 0 {
		return c.HealthzTimeout
	}
	return healthcheck.DefaultTimeout(c.MaxSyncInterval)
}

// RunnerOptions returns the servicelb.RunnerOptions the flags describe.
func (c *Config) RunnerOptions(node servicelb.NodeConfig) servicelb.RunnerOptions {
	return servicelb.RunnerOptions{
		Node:            node,
		MinSyncInterval: c.MinSyncInterval,
		MaxSyncInterval: c.MaxSyncInterval,
	}
}
