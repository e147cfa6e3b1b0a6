package kubeproxyconfig

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// Options is kube-proxy's command line (Kubernetes v1.36, Linux): its
// flags, with kube-proxy's names, types and meaning, bound to a
// configuration as kube-proxy binds them. Complete turns the command
// line into the configuration kube-proxy would run with: the --config
// file when one is named (it replaces the flags' configuration, as in
// kube-proxy, but for --hostname-override and the logging flags given),
// else the flags' own.
type Options struct {
	// ConfigFile is --config.
	ConfigFile string
	// WriteConfigTo is --write-config-to: write the configuration and
	// exit.
	WriteConfigTo string
	// Cleanup is --cleanup: remove the proxy's rules and exit.
	Cleanup bool
	// InitOnly is --init-only: set the node up and exit.
	InitOnly bool
	// HostnameOverride is --hostname-override: the node's name.
	HostnameOverride string
	// Master is --master: the API server, over the kubeconfig's.
	Master string

	config *Config
	fs     *pflag.FlagSet
	// mine are the flags AddFlags registered.
	mine map[string]bool
	// flags of the flags' configuration that kube-proxy processes after
	// parsing
	healthzPort, metricsPort      int32
	iptablesSync, iptablesMinSync time.Duration
	ipvsSync, ipvsMinSync         time.Duration
	clusterCIDRs                  string
	localhostNodePorts            bool
}

// NewOptions returns the command line with kube-proxy's defaults.
func NewOptions() *Options {
	c := &Config{}
	c.APIVersion, c.Kind = APIVersion, Kind
	defaultScheme(c)
	return &Options{config: c, healthzPort: HealthzPort, metricsPort: MetricsPort,
		iptablesSync: DefaultSyncPeriod, iptablesMinSync: DefaultMinSyncPeriod,
		ipvsSync: DefaultSyncPeriod, ipvsMinSync: DefaultMinSyncPeriod}
}

// AddFlags registers kube-proxy's flags on fs. Flags of the same name
// already on fs are left there: a program that has a flag of
// kube-proxy's name registers it first and gives it kube-proxy's
// meaning itself.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.fs, o.mine = fs, map[string]bool{}
	c := o.config
	add := func(name string, f func()) {
		if fs.Lookup(name) == nil {
			f()
			o.mine[name] = true
		}
	}
	add("config", func() {
		fs.StringVar(&o.ConfigFile, "config", "", "the path to the configuration file (a KubeProxyConfiguration); the flags bound to it are then ignored, as in kube-proxy")
	})
	add("write-config-to", func() {
		fs.StringVar(&o.WriteConfigTo, "write-config-to", "", "write the configuration in use to this file, then exit")
	})
	add("cleanup", func() { fs.BoolVar(&o.Cleanup, "cleanup", false, "remove the proxy's rules, then exit") })
	add("init-only", func() { fs.BoolVar(&o.InitOnly, "init-only", false, "set the node up, then exit") })
	add("hostname-override", func() {
		fs.StringVar(&o.HostnameOverride, "hostname-override", "", "the node's name, when not the hostname (also with --config)")
	})
	add("master", func() {
		fs.StringVar(&o.Master, "master", "", "the API server's address, over the kubeconfig's (also with --config)")
	})
	add("feature-gates", func() {
		fs.Var(&gatesValue{m: &c.FeatureGates}, "feature-gates", "kube-proxy's feature gates, A=true,B=false")
	})
	cc := &c.ClientConnection
	add("kubeconfig", func() { fs.StringVar(&cc.Kubeconfig, "kubeconfig", cc.Kubeconfig, "the kubeconfig file") })
	add("kube-api-content-type", func() {
		fs.StringVar(&cc.ContentType, "kube-api-content-type", cc.ContentType, "content type of requests to the API server")
	})
	add("kube-api-burst", func() { fs.Int32Var(&cc.Burst, "kube-api-burst", cc.Burst, "burst of requests to the API server") })
	add("kube-api-qps", func() { fs.Float32Var(&cc.QPS, "kube-api-qps", cc.QPS, "requests per second to the API server") })
	o.addAddressFlags(fs, add)
	add("profiling", func() {
		fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "serve Go's profiles on the metrics address")
	})
	add("show-hidden-metrics-for-version", func() {
		fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", "the previous version whose hidden metrics to show")
	})
	add("proxy-mode", func() {
		fs.Var((*modeValue)(&c.Mode), "proxy-mode", "the proxy mode: iptables, ipvs or nftables (and kproxy's ebpf and userspace)")
	})
	o.addModeFlags(fs, add)
	o.addLocalFlags(fs, add)
	o.addConntrackFlags(fs, add)
	add("config-sync-period", func() {
		fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "how often the configuration is read again from the API server")
	})
	add("oom-score-adj", func() {
		fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "the proxy's OOM score adjustment")
	})
	add("healthz-port", func() {
		fs.Int32Var(&o.healthzPort, "healthz-port", o.healthzPort, "the health server's port (0 turns it off)")
		fs.MarkDeprecated("healthz-port", "use --healthz-bind-address")
	})
	add("metrics-port", func() {
		fs.Int32Var(&o.metricsPort, "metrics-port", o.metricsPort, "the metrics server's port")
		fs.MarkDeprecated("metrics-port", "use --metrics-bind-address")
	})
	o.addLogFlags(fs, add)
}

func (o *Options) addAddressFlags(fs *pflag.FlagSet, add func(string, func())) {
	c := o.config
	add("bind-address", func() {
		fs.Var(&ipValue{p: &c.BindAddress}, "bind-address", "an address of the node: over the Node's primary address of its family")
	})
	add("healthz-bind-address", func() {
		fs.Var(&ipPortValue{p: &c.HealthzBindAddress, port: HealthzPort}, "healthz-bind-address", "the health server's IP:port")
	})
	add("metrics-bind-address", func() {
		fs.Var(&ipPortValue{p: &c.MetricsBindAddress, port: MetricsPort}, "metrics-bind-address", "the metrics server's IP:port")
	})
	add("bind-address-hard-fail", func() {
		fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", false, "fail when a server's port cannot be bound")
	})
	add("nodeport-addresses", func() {
		fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", nil, "CIDRs of the addresses that serve node ports, or primary")
	})
}

func (o *Options) addModeFlags(fs *pflag.FlagSet, add func(string, func())) {
	c := o.config
	add("iptables-masquerade-bit", func() {
		fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "the mark bit of traffic to masquerade (iptables and ipvs)")
	})
	add("masquerade-all", func() {
		fs.BoolVar(&c.IPTables.MasqueradeAll, "masquerade-all", false, "masquerade all traffic to cluster IPs")
	})
	add("iptables-localhost-nodeports", func() {
		fs.BoolVar(&o.localhostNodePorts, "iptables-localhost-nodeports", true, "serve node ports on 127.0.0.1 (iptables)")
	})
	add("iptables-sync-period", func() {
		fs.DurationVar(&o.iptablesSync, "iptables-sync-period", o.iptablesSync, "the most time between two syncs")
	})
	add("iptables-min-sync-period", func() {
		fs.DurationVar(&o.iptablesMinSync, "iptables-min-sync-period", o.iptablesMinSync, "the least time between two syncs")
	})
	add("ipvs-sync-period", func() {
		fs.DurationVar(&o.ipvsSync, "ipvs-sync-period", o.ipvsSync, "the most time between two syncs (ipvs)")
	})
	add("ipvs-min-sync-period", func() {
		fs.DurationVar(&o.ipvsMinSync, "ipvs-min-sync-period", o.ipvsMinSync, "the least time between two syncs (ipvs)")
	})
	add("ipvs-scheduler", func() { fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", "", "the ipvs scheduler") })
	add("ipvs-exclude-cidrs", func() {
		fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", nil, "CIDRs ipvs cleanup leaves alone")
	})
	add("ipvs-strict-arp", func() {
		fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", false, "answer no ARP for the ipvs link's addresses")
	})
	add("ipvs-tcp-timeout", func() { fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "the ipvs TCP timeout") })
	add("ipvs-tcpfin-timeout", func() {
		fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "the ipvs TCP FIN timeout")
	})
	add("ipvs-udp-timeout", func() { fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "the ipvs UDP timeout") })
}

func (o *Options) addLocalFlags(fs *pflag.FlagSet, add func(string, func())) {
	c := o.config
	add("detect-local-mode", func() {
		fs.Var((*localModeValue)(&c.DetectLocalMode), "detect-local-mode", "how local traffic is told: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	})
	add("pod-bridge-interface", func() {
		fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "the pods' bridge, for BridgeInterface")
	})
	add("pod-interface-name-prefix", func() {
		fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "the pods' interface name prefix, for InterfaceNamePrefix")
	})
	add("cluster-cidr", func() {
		fs.StringVar(&o.clusterCIDRs, "cluster-cidr", "", "the pods' CIDRs, comma-separated, for ClusterCIDR")
	})
}

func (o *Options) addConntrackFlags(fs *pflag.FlagSet, add func(string, func())) {
	ct := &o.config.Conntrack
	add("conntrack-max-per-core", func() {
		fs.Int32Var(ct.MaxPerCore, "conntrack-max-per-core", *ct.MaxPerCore, "nf_conntrack_max per CPU (0 leaves it alone)")
	})
	add("conntrack-min", func() { fs.Int32Var(ct.Min, "conntrack-min", *ct.Min, "the least nf_conntrack_max") })
	add("conntrack-tcp-timeout-established", func() {
		fs.DurationVar(&ct.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout.Duration, "the conntrack timeout of established TCP flows (0 leaves it alone)")
	})
	add("conntrack-tcp-timeout-close-wait", func() {
		fs.DurationVar(&ct.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout.Duration, "the conntrack timeout of TCP flows in CLOSE_WAIT (0 leaves it alone)")
	})
	add("conntrack-tcp-be-liberal", func() {
		fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "mark no out-of-window TCP packet invalid")
	})
	add("conntrack-udp-timeout", func() {
		fs.DurationVar(&ct.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "the conntrack timeout of UDP flows")
	})
	add("conntrack-udp-timeout-stream", func() {
		fs.DurationVar(&ct.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "the conntrack timeout of UDP streams")
	})
}

// logFlags are kube-proxy's logging flags, which apply with --config too.
var logFlags = []string{"v", "vmodule", "logging-format", "log-flush-frequency",
	"log-text-split-stream", "log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size"}

func (o *Options) addLogFlags(fs *pflag.FlagSet, add func(string, func())) {
	l := &o.config.Logging
	add("v", func() { fs.VarP((*verbosityValue)(&l.Verbosity), "v", "v", "the log verbosity") })
	add("vmodule", func() { fs.Var((*vmoduleValue)(&l.VModule), "vmodule", "the verbosity by file, pattern=N,...") })
	add("logging-format", func() { fs.StringVar(&l.Format, "logging-format", l.Format, "the log format: text or json") })
	add("log-flush-frequency", func() {
		fs.DurationVar(&l.FlushFrequency.Duration.Duration, "log-flush-frequency", l.FlushFrequency.Duration.Duration, "the most time the logs are buffered")
	})
	add("log-text-split-stream", func() {
		fs.BoolVar(&l.Options.Text.SplitStream, "log-text-split-stream", false, "info to stdout, errors to stderr")
	})
	add("log-json-split-stream", func() {
		fs.BoolVar(&l.Options.JSON.SplitStream, "log-json-split-stream", false, "info to stdout, errors to stderr")
	})
	add("log-text-info-buffer-size", func() {
		fs.Var(quantityValue{&l.Options.Text.InfoBufferSize}, "log-text-info-buffer-size", "the buffer of info lines")
	})
	add("log-json-info-buffer-size", func() {
		fs.Var(quantityValue{&l.Options.JSON.InfoBufferSize}, "log-json-info-buffer-size", "the buffer of info lines")
	})
}

// Given returns the names of the flags AddFlags registered that the
// command line set, sorted.
func (o *Options) Given() []string {
	var out []string
	for name := range o.mine {
		if o.changed(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// changed reports whether the command line set a flag of kube-proxy's.
func (o *Options) changed(name string) bool {
	f := o.fs.Lookup(name)
	return f != nil && f.Changed
}

// Complete returns the configuration kube-proxy would run with: the
// --config file as written, or the flags' configuration (which holds
// kube-proxy's defaults of the flags), with the platform's defaults; and
// a warning for each flag of the command line that it ignores, as
// kube-proxy ignores it: with --config, every flag bound to the
// configuration but for the logging flags, --hostname-override and
// --master. Resolve defaults and validates it.
func (o *Options) Complete() (*Config, []string, error) {
	var c *Config
	var warnings []string
	if o.ConfigFile != "" {
		var err error
		var unknown []string
		if c, unknown, err = Load(o.ConfigFile); err != nil {
			return nil, nil, err
		}
		warnings = append(warnings, unknown...)
		for _, name := range o.boundFlags() {
			if o.changed(name) {
				warnings = append(warnings, fmt.Sprintf("--%s is ignored: the --config file replaces the flags, as in kube-proxy", name))
			}
		}
		o.copyLogFlags(c)
	} else {
		c = o.config
		o.applyFlags(c)
	}
	platformDefaults(c)
	if o.HostnameOverride != "" || o.changed("hostname-override") {
		h := strings.TrimSpace(o.HostnameOverride)
		if h == "" {
			return nil, nil, fmt.Errorf("--hostname-override: %w: an empty name", ErrInvalid)
		}
		c.HostnameOverride = strings.ToLower(h)
	}
	return c, warnings, nil
}

// Resolve is Complete, then the package's Resolve: the configuration and
// what it means to kproxy. Without --config, the fields named ignored
// are those of the flags given, never a flag's default.
func (o *Options) Resolve(ctx Context) (*Config, Result, error) {
	c, warnings, err := o.Complete()
	if err != nil {
		return nil, Result{}, err
	}
	r, err := Resolve(c, ctx)
	if err != nil {
		return nil, Result{}, err
	}
	r.Warnings = append(warnings, r.Warnings...)
	if o.ConfigFile == "" {
		base := NewOptions()
		base.fs = pflag.NewFlagSet("", pflag.ContinueOnError)
		bc, _, err := base.Complete()
		if err != nil {
			return nil, Result{}, err
		}
		defaults := Translate(bc, ctx).Ignored
		r.Ignored = slices.DeleteFunc(r.Ignored, func(i Ignored) bool { return slices.Contains(defaults, i) })
	}
	return c, r, nil
}

// boundFlags are the flags AddFlags registered that are bound to the
// configuration, which --config replaces.
func (o *Options) boundFlags() []string {
	var out []string
	for name := range o.mine {
		switch {
		case slices.Contains(logFlags, name):
		case slices.Contains([]string{"config", "write-config-to", "cleanup", "init-only", "hostname-override", "master"}, name):
		default:
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// copyLogFlags copies the logging flags the command line gave over the
// file's, as kube-proxy does (the command line's vmodule first).
func (o *Options) copyLogFlags(c *Config) {
	l := o.config.Logging
	if o.changed("v") {
		c.Logging.Verbosity = l.Verbosity
	}
	if o.changed("vmodule") {
		c.Logging.VModule = append(slices.Clone(l.VModule), c.Logging.VModule...)
	}
	if o.changed("logging-format") {
		c.Logging.Format = l.Format
	}
	if o.changed("log-flush-frequency") {
		c.Logging.FlushFrequency = l.FlushFrequency
	}
}

// applyFlags is what kube-proxy makes of the flags without --config: the
// deprecated ports, the sync periods of the mode's flags and the cluster
// CIDRs.
func (o *Options) applyFlags(c *Config) {
	if o.changed("healthz-port") || o.changed("metrics-port") {
		c.HealthzBindAddress = portAddress(c.HealthzBindAddress, o.healthzPort)
		c.MetricsBindAddress = portAddress(c.MetricsBindAddress, o.metricsPort)
	}
	if o.mine["iptables-localhost-nodeports"] {
		c.IPTables.LocalhostNodePorts = ptr(o.localhostNodePorts)
	}
	// One pair of periods serves the mode: the ipvs flags' in ipvs mode,
	// the iptables flags' in the others (nftables too).
	if c.Mode == ModeIPVS {
		if o.changed("ipvs-sync-period") {
			c.IPVS.SyncPeriod.Duration = o.ipvsSync
		}
		if o.changed("ipvs-min-sync-period") {
			c.IPVS.MinSyncPeriod.Duration = o.ipvsMinSync
		}
	} else {
		if o.changed("iptables-sync-period") {
			c.IPTables.SyncPeriod.Duration, c.NFTables.SyncPeriod.Duration = o.iptablesSync, o.iptablesSync
		}
		if o.changed("iptables-min-sync-period") {
			c.IPTables.MinSyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration = o.iptablesMinSync, o.iptablesMinSync
		}
	}
	if o.changed("cluster-cidr") {
		c.ClusterCIDR = o.clusterCIDRs
	}
}

// portAddress is kube-proxy's address of a deprecated port flag: none for
// port 0, the address with the port otherwise (an address that has one
// keeps it).
func portAddress(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// defaultScheme applies the defaults kube-proxy's scheme applies, without
// the platform's (which Complete applies last).
func defaultScheme(c *Config) {
	mode, local, npa := c.Mode, c.DetectLocalMode, c.NodePortAddresses
	Default(c)
	c.Mode, c.DetectLocalMode, c.NodePortAddresses = mode, local, npa
}

// The flag values of kube-proxy's own types.

type ipValue struct{ p *string }

func (v *ipValue) String() string { return *v.p }
func (v *ipValue) Type() string   { return "ip" }
func (v *ipValue) Set(s string) error {
	if s == "" {
		return nil // kube-proxy's: empty leaves the value alone
	}
	if net.ParseIP(strings.TrimSpace(s)) == nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*v.p = strings.TrimSpace(s)
	return nil
}

// ipPortValue takes an IP or an IP:port, as kube-proxy's; an IP alone
// gets port.
type ipPortValue struct {
	p    *string
	port int
}

func (v *ipPortValue) String() string { return *v.p }
func (v *ipPortValue) Type() string   { return "ipport" }
func (v *ipPortValue) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		*v.p = net.JoinHostPort(a.String(), strconv.Itoa(v.port))
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not in a valid format (ip or ip:port): %w", s, err)
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q is not a valid number", port)
	}
	*v.p = s
	return nil
}

type modeValue kpv1alpha1.ProxyMode

func (v *modeValue) String() string     { return string(*v) }
func (v *modeValue) Type() string       { return "ProxyMode" }
func (v *modeValue) Set(s string) error { *v = modeValue(s); return nil }

type localModeValue kpv1alpha1.LocalMode

func (v *localModeValue) String() string     { return string(*v) }
func (v *localModeValue) Type() string       { return "LocalMode" }
func (v *localModeValue) Set(s string) error { *v = localModeValue(s); return nil }

type verbosityValue logsapi.VerbosityLevel

func (v *verbosityValue) String() string { return strconv.Itoa(int(*v)) }
func (v *verbosityValue) Type() string   { return "Level" }
func (v *verbosityValue) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 31)
	if err != nil {
		return fmt.Errorf("%q is not a verbosity level: %w", s, err)
	}
	*v = verbosityValue(n)
	return nil
}

type vmoduleValue logsapi.VModuleConfiguration

func (v *vmoduleValue) String() string {
	var parts []string
	for _, m := range *v {
		parts = append(parts, fmt.Sprintf("%s=%d", m.FilePattern, m.Verbosity))
	}
	return strings.Join(parts, ",")
}
func (v *vmoduleValue) Type() string { return "pattern=N,..." }
func (v *vmoduleValue) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		pat, level, ok := strings.Cut(part, "=")
		n, err := strconv.ParseUint(level, 10, 31)
		if !ok || err != nil || pat == "" {
			return fmt.Errorf("%q is not pattern=N", part)
		}
		*v = append(*v, logsapi.VModuleItem{FilePattern: pat, Verbosity: logsapi.VerbosityLevel(n)})
	}
	return nil
}

type quantityValue struct{ q *resource.QuantityValue }

func (v quantityValue) String() string     { return v.q.String() }
func (v quantityValue) Type() string       { return "quantity" }
func (v quantityValue) Set(s string) error { return v.q.Set(s) }

type gatesValue struct{ m *map[string]bool }

func (v *gatesValue) String() string {
	var parts []string
	for k, b := range *v.m {
		parts = append(parts, fmt.Sprintf("%s=%t", k, b))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
func (v *gatesValue) Type() string { return "mapStringBool" }
func (v *gatesValue) Set(s string) error {
	if *v.m == nil {
		*v.m = map[string]bool{}
	}
	for part := range strings.SplitSeq(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		b, err := strconv.ParseBool(val)
		if !ok || err != nil || k == "" {
			return fmt.Errorf("%q is not Gate=true|false", part)
		}
		(*v.m)[k] = b
	}
	return nil
}
