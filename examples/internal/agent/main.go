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
	"time"

	"github.com/spf13/pflag"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// DefaultMetricsAddr is where a program serves its metrics unless told
// otherwise: kube-proxy's metricsBindAddress; DefaultMetricsPort is its
// port, that of an address given without one.
const (
	DefaultMetricsAddr = "127.0.0.1:10249"
	DefaultMetricsPort = 10249
	// healthzPort is the port of the proxy's health (healthcheck's
	// DefaultAddr).
	healthzPort = 10256
)

// withPort returns an address alone joined with port, and anything else
// as it is.
func withPort(addr string, port int) string {
	if a, err := netip.ParseAddr(addr); err == nil {
		return netip.AddrPortFrom(a, uint16(port)).String()
	}
	return addr
}

// Program is a node agent binary: its help text, its own flags, its
// configuration file and its sources.
type Program struct {
	// Name is the binary's name.
	Name string
	// Usage is the help text above the flags: what the agent does and
	// needs.
	Usage string
	// Build is what --version prints.
	Build BuildInfo
	// Flags registers the agent's own flags.
	Flags func(fs *flag.FlagSet)
	// MoreFlags, when set, registers flags beside the agent's that another
	// program's command line has (kproxy: kube-proxy's), with that
	// program's syntax (spf13/pflag's, as kube-proxy's: --name=value,
	// -v=2); a flag of the same name as one of the agent's is the agent's.
	// LoadConfig makes flag values of them.
	MoreFlags func(fs *pflag.FlagSet)
	// LoadConfig, when set, reads the --config file (path, empty when none
	// is named) and the MoreFlags given: the flag values they give
	// (applied to the flags the command line does not set) and the fields
	// they set that are ignored. given returns a flag's value from the
	// command line, and whether the command line set it. Without MoreFlags
	// it is called only with a path.
	LoadConfig func(path string, given func(flag string) (string, bool)) (ConfigFile, error)
	// Sources returns the agent's sources once the flags are parsed. It
	// may fill in defaults in s.Config.
	Sources func(s Setup) ([]Source, error)
	// NodeCIDRs, when set, returns the pod CIDRs of the named node from
	// where the agent's sources know them (the Kubernetes source reads its
	// Node's spec.podCIDRs). It is asked, after Sources, under
	// --detect-local-mode=NodeCIDR without --node-cidrs.
	NodeCIDRs func(ctx context.Context, node string) ([]netip.Prefix, error)
}

// Setup is what Program.Sources is given.
type Setup struct {
	// Config is the configuration from the flags and the config file.
	Config *Config
	Logger *slog.Logger
	// Given reports whether the command line set a flag.
	Given func(flag string) bool
}

// ConfigFile is what a configuration file says in terms of flags.
type ConfigFile struct {
	// Settings are flag values; each names the file's field it comes
	// from.
	Settings []FileSetting
	// Ignored are the fields set in the file that the program does not
	// use, each with the reason; Warnings are other remarks on the file
	// (unknown fields).
	Ignored  []IgnoredField
	Warnings []string
	// Done, when set, says that the command line asked for no more than
	// what reading it did (such as writing the configuration out): the
	// program logs it and exits with status 0.
	Done string
}

// FileSetting is a flag's value from a configuration file's field.
type FileSetting struct{ Field, Flag, Value string }

// IgnoredField is a field of a configuration file that is not used.
type IgnoredField struct{ Field, Value, Reason string }

// Main runs the program with the process's arguments until SIGINT or
// SIGTERM, and exits: 0 on success, 1 on error, 2 on bad flags. The
// first signal asks the program to stop; a second one, or ShutdownTimeout
// without the program done, ends the process at once with status 1, so
// that a signal always ends it.
func Main(p Program) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal now ends the process, by default
		time.Sleep(ShutdownTimeout)
		fmt.Fprintf(os.Stderr, "%s: not stopped %s after the signal; exiting\n", p.Name, ShutdownTimeout)
		os.Exit(1)
	}()
	code := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// ShutdownTimeout bounds the time from SIGTERM to the end of the process.
const ShutdownTimeout = 30 * time.Second

// programFlags are the flags of a binary beside the agent's Config.
type programFlags struct {
	config      string
	version     bool
	cleanup     bool
	metricsAddr string // the deprecated --metrics-addr
}

func (o *programFlags) register(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&o.config, "config", "", "a kube-proxy configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1); flags given override it")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.cleanup, "cleanup", false, "remove what every backend owns in the --netns namespace (the nftables table, the iptables chains, the IPVS virtual servers, link and sets, the ebpf hooks and pins under --bpf-pin-path), then exit")
	fs.StringVar(&c.MetricsAddr, "metrics-bind-address", DefaultMetricsAddr, "serve Prometheus /metrics and /healthz on this address; empty turns it off")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "deprecated: use --metrics-bind-address")
	fs.BoolVar(&c.Profiling, "profiling", false, "serve Go's profiles under /debug/pprof/ on the metrics address")
}

// Run runs the program with args until ctx ends and returns its exit code;
// logs go to errOut. Arguments that start with explain or state run that
// subcommand instead, which asks a running program (see inspect.go).
func (p Program) Run(ctx context.Context, args []string, stdout, errOut io.Writer) int {
	if code, ok := p.subcommand(ctx, args, stdout, errOut); ok {
		return code
	}
	gfs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	var cfg Config
	cfg.RegisterFlags(gfs)
	var o programFlags
	o.register(gfs, &cfg)
	if p.Flags != nil {
		p.Flags(gfs)
	}
	// The command line is parsed as kube-proxy's is, by pflag: the
	// agent's flags, and MoreFlags beside them.
	fs := pflag.NewFlagSet(p.Name, pflag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.SortFlags = false
	fs.AddGoFlagSet(gfs)
	if p.MoreFlags != nil {
		p.MoreFlags(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(errOut, "%s\n\nUsage: %s [flags]\n       %s explain|state [flags]   ask a running %s why (%s explain -help)\n\nFlags:\n",
			p.Usage, p.Name, p.Name, p.Name, p.Name)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(errOut, "%s: %v\n", p.Name, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(errOut, "%s: unexpected arguments %q\n", p.Name, fs.Args())
		return 2
	}
	if o.version {
		fmt.Fprintln(stdout, p.Build.Line(p.Name))
		return 0
	}
	given := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { given[f.Name] = true })
	if given["metrics-addr"] && !given["metrics-bind-address"] {
		cfg.MetricsAddr = o.metricsAddr
	}
	file, err := p.applyConfig(fs, o.config, given)
	if err != nil {
		fmt.Fprintf(errOut, "%s: %v\n", p.Name, err)
		return 2
	}
	// An address without a port is served on the server's port, as
	// kube-proxy reads --healthz-bind-address and --metrics-bind-address.
	cfg.HealthzBindAddress = withPort(cfg.HealthzBindAddress, healthzPort)
	cfg.MetricsAddr = withPort(cfg.MetricsAddr, DefaultMetricsPort)
	log, err := cfg.LoggerTo(errOut)
	if err != nil {
		fmt.Fprintf(errOut, "%s: %v\n", p.Name, err)
		return 2
	}
	warnConfig(log, o.config, file)
	if file.Done != "" {
		log.Info(file.Done)
		return 0
	}
	if given["metrics-addr"] {
		log.Warn("--metrics-addr is deprecated: use --metrics-bind-address")
	}
	if o.cleanup {
		return p.cleanup(ctx, cfg, log)
	}
	s := Setup{Config: &cfg, Logger: log, Given: func(name string) bool { return given[name] }}
	if err := p.start(ctx, s, stdout); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}

// applyConfig reads the config file, if any, and sets the flags it gives
// that the command line does not.
func (p Program) applyConfig(fs *pflag.FlagSet, path string, given map[string]bool) (ConfigFile, error) {
	if path == "" && (p.MoreFlags == nil || p.LoadConfig == nil) {
		return ConfigFile{}, nil
	}
	if p.LoadConfig == nil {
		return ConfigFile{}, errors.New("--config: this program reads no configuration file")
	}
	file, err := p.LoadConfig(path, func(name string) (string, bool) {
		f := fs.Lookup(name)
		if f == nil {
			return "", false
		}
		return f.Value.String(), given[name]
	})
	if err != nil {
		return file, err
	}
	for _, s := range file.Settings {
		if given[s.Flag] {
			continue
		}
		if err := fs.Set(s.Flag, s.Value); err != nil {
			from := "config " + path
			if path == "" {
				from = "flags"
			}
			return file, fmt.Errorf("%s: %s: %q: --%s: %w", from, s.Field, s.Value, s.Flag, err)
		}
	}
	return file, nil
}

// warnConfig logs one warning per ignored field of the config file, and
// its other remarks.
func warnConfig(log *slog.Logger, path string, file ConfigFile) {
	for _, w := range file.Warnings {
		log.Warn("config: "+w, "file", path)
	}
	for _, f := range file.Ignored {
		log.Warn("config field ignored", "file", path, "field", f.Field, "value", f.Value, "reason", f.Reason)
	}
}

// cleanup runs --cleanup: every backend's Cleanup in the namespace.
func (p Program) cleanup(ctx context.Context, cfg Config, log *slog.Logger) int {
	if cfg.DryRun {
		log.Error("--cleanup and --dry-run: a dry run removes nothing")
		return 2
	}
	ns, err := openNetNS(cfg.NetNS)
	if err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	if ns.IsOpen() {
		defer ns.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := CleanupAll(ctx, BackendOptions{NetNS: ns, Logger: log, Cgroup: cfg.Cgroup, PinPath: cfg.BPFPinPath}); err != nil {
		log.Error("cleanup failed", "err", err)
		return 1
	}
	return 0
}

func (p Program) start(ctx context.Context, s Setup, stdout io.Writer) error {
	sources, err := p.Sources(s)
	if err != nil {
		return err
	}
	cfg, log := s.Config, s.Logger
	if err := p.nodeCIDRs(ctx, cfg, log); err != nil {
		return err
	}
	a, err := New(Options{Config: *cfg, Logger: log, Stdout: stdout})
	if err != nil {
		return err
	}
	defer a.Close()
	log.Info("starting", "version", p.Build.Version(), "backend", cfg.Backend, "dryRun", cfg.DryRun, "netns", cfg.NetNS, "node", cfg.NodeName)
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

// openNetNS opens a namespace named in /run/netns or by path; empty means
// none (the caller's).
func openNetNS(name string) (netns.NsHandle, error) {
	if name == "" {
		return netns.None(), nil
	}
	path := name
	if !strings.Contains(path, "/") {
		path = "/run/netns/" + path
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return netns.None(), fmt.Errorf("--netns %s: %w", name, err)
	}
	return ns, nil
}
