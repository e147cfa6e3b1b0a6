// Command kproxy is a node proxy that can take kube-proxy's place: it
// load-balances services with kproxy's nftables, iptables, ipvs, ebpf or
// userspace backend (--backend), fed from one source (--source):
//
//   - kubernetes (the default): Services and EndpointSlices, as
//     kube-proxy, through a kubeconfig (--kubeconfig) or the in-cluster
//     configuration;
//   - consul: Consul's catalog and health checks, on virtual addresses
//     from a mapping file (--consul-mapping) or the services' meta;
//   - file: a YAML or JSON file of services it watches (--file).
//
// It reads kube-proxy's configuration file (--config, a
// KubeProxyConfiguration), names each field it ignores, and lets flags
// override it. --cleanup removes the rules of every backend and exits, as
// kube-proxy's does. It serves kube-proxy's metrics on 127.0.0.1:10249 and
// its /healthz and /livez on 0.0.0.0:10256. Beside the metrics it answers
// an operator's questions: /configz and /proxyMode as kube-proxy, /state
// (what it serves, leaves out and last did) and /explain (what it decides
// for a flow, and why), which `kproxy state` and `kproxy explain --from
// 10.244.1.5 --to 10.96.0.10:80/tcp` ask; `kproxy explain --state` answers
// offline from a state `kproxy state --json` dumped.
//
// It needs CAP_NET_ADMIN in the network namespace it programs (the ebpf
// backend CAP_BPF too) and the kernel support of its backend, except with
// --dry-run, which prints the rules and installs nothing, and with the
// userspace backend holding no address (--userspace-hold-addresses=false,
// --userspace-listen-at), which needs no privilege at all; that backend's
// per-port counters are its kproxy_userspace_* metrics:
//
//	go run ./examples/cmd/kproxy --source file --file examples/cmd/kproxy/services.yaml --dry-run --once
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/consulsource"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
	"github.com/kproxy-dev/kproxy/kube/kubeproxyconfig"
)

// Set at link time: -ldflags "-X main.version=v0.3.0 -X main.commit=...".
var version, commit string

func main() { agent.Main(program()) }

// source is one --source: its flags and how it starts.
type source struct {
	name string
	// flags registers the source's flags and returns their names.
	flags func(fs *flag.FlagSet) []string
	// start returns the source, once the flags are parsed.
	start func(s agent.Setup) (agent.Source, error)
	// names of the flags flags registered
	names []string
}

// sources are the --source values.
type sources struct {
	choice string
	list   []*source
	kube   *kubeSource
}

func newSources() *sources {
	k := &kubeSource{}
	var file string
	c := &consulSource{}
	return &sources{kube: k, list: []*source{
		{name: "kubernetes", flags: k.register, start: k.start},
		{name: "consul", flags: c.register, start: c.start},
		{name: "file", flags: func(fs *flag.FlagSet) []string {
			fs.StringVar(&file, "file", "", "file source: the services file, YAML or JSON, watched for changes")
			return []string{"file"}
		}, start: func(s agent.Setup) (agent.Source, error) {
			if file == "" {
				return nil, errors.New("--source file: --file is required")
			}
			return &filesource.Source{Path: file, Logger: s.Logger}, nil
		}},
	}}
}

func (ss *sources) register(fs *flag.FlagSet) {
	var names []string
	for _, s := range ss.list {
		names = append(names, s.name)
	}
	fs.StringVar(&ss.choice, "source", "kubernetes", "where services come from: "+strings.Join(names, ", "))
	for _, s := range ss.list {
		s.names = s.flags(fs)
	}
}

func (ss *sources) lookup(name string) (*source, error) {
	for _, s := range ss.list {
		if s.name == name {
			return s, nil
		}
	}
	var names []string
	for _, s := range ss.list {
		names = append(names, s.name)
	}
	return nil, fmt.Errorf("--source %q: want one of %s", name, strings.Join(names, ", "))
}

// start returns the chosen source; a flag of another source given on the
// command line is an error, not silently unused.
func (ss *sources) start(s agent.Setup) ([]agent.Source, error) {
	chosen, err := ss.lookup(ss.choice)
	if err != nil {
		return nil, err
	}
	for _, o := range ss.list {
		if o == chosen {
			continue
		}
		for _, f := range o.names {
			if s.Given(f) {
				return nil, fmt.Errorf("--%s is for --source %s, not %s", f, o.name, chosen.name)
			}
		}
	}
	src, err := chosen.start(s)
	if err != nil {
		return nil, err
	}
	return []agent.Source{src}, nil
}

func program() agent.Program {
	ss := newSources()
	kp := kubeproxyconfig.NewOptions()
	return agent.Program{
		Name: "kproxy",
		Usage: "kproxy: a node proxy with kube-proxy's semantics, fed by Kubernetes, Consul or a file.\n" +
			"Needs CAP_NET_ADMIN unless --dry-run.",
		Build:     agent.NewBuildInfo(version, commit),
		Flags:     ss.register,
		MoreFlags: kp.AddFlags,
		LoadConfig: func(path string, given func(string) (string, bool)) (agent.ConfigFile, error) {
			return loadConfig(kp, path, given)
		},
		Sources: ss.start,
		NodeCIDRs: func(ctx context.Context, node string) ([]netip.Prefix, error) {
			if ss.choice != "kubernetes" {
				return nil, fmt.Errorf("--source %s knows no node's pod CIDRs: give --node-cidrs", ss.choice)
			}
			return ss.kube.podCIDRs(ctx, node)
		},
	}
}

// loadConfig reads kube-proxy's configuration, from the --config file or,
// without one, from kube-proxy's flags given, for the backend and source
// the command line chose: with neither, it gives nothing, and kproxy's
// flags and their defaults alone decide.
func loadConfig(kp *kubeproxyconfig.Options, path string, given func(string) (string, bool)) (agent.ConfigFile, error) {
	kp.ConfigFile = path
	if path == "" && len(kp.Given()) == 0 {
		return agent.ConfigFile{}, nil
	}
	ctx := kubeproxyconfig.Context{}
	ctx.Source, _ = given("source")
	if b, set := given("backend"); set {
		ctx.Backend = b
	}
	c, r, err := kp.Resolve(ctx)
	if err != nil {
		if path == "" {
			return agent.ConfigFile{}, fmt.Errorf("kube-proxy flags: %w", err)
		}
		return agent.ConfigFile{}, fmt.Errorf("config %s: %w", path, err)
	}
	out := agent.ConfigFile{Warnings: r.Warnings}
	switch {
	case kp.WriteConfigTo != "":
		if err := kubeproxyconfig.Write(kp.WriteConfigTo, c); err != nil {
			return agent.ConfigFile{}, fmt.Errorf("--write-config-to: %w", err)
		}
		out.Done = "configuration written to " + kp.WriteConfigTo
	case kp.InitOnly:
		out.Done = "--init-only: kproxy sets the node up as it starts; nothing to do before"
	}
	for _, s := range r.Settings {
		out.Settings = append(out.Settings, agent.FileSetting{Field: s.Field, Flag: s.Flag, Value: s.Value})
	}
	for _, i := range r.Ignored {
		out.Ignored = append(out.Ignored, agent.IgnoredField{Field: i.Field, Value: i.Value, Reason: i.Reason})
	}
	return out, nil
}

// consulSource is --source consul.
type consulSource struct {
	client       consulsource.ClientOptions
	mapping      string
	warningReady bool
}

func (c *consulSource) register(fs *flag.FlagSet) []string {
	fs.StringVar(&c.client.Addr, "consul-addr", "", "consul source: the HTTP API's address, host:port or a URL (default: $CONSUL_HTTP_ADDR, else 127.0.0.1:8500)")
	fs.StringVar(&c.client.Token, "consul-token", "", "consul source: the ACL token (default: $CONSUL_HTTP_TOKEN)")
	fs.StringVar(&c.client.CAFile, "consul-ca-file", "", "consul source: PEM file of the CA of Consul's certificate; turns https on (default: $CONSUL_CACERT)")
	fs.StringVar(&c.client.CertFile, "consul-client-cert", "", "consul source: PEM file of the client certificate, when Consul verifies clients (default: $CONSUL_CLIENT_CERT)")
	fs.StringVar(&c.client.KeyFile, "consul-client-key", "", "consul source: PEM file of the client certificate's key (default: $CONSUL_CLIENT_KEY)")
	fs.StringVar(&c.client.TLSServerName, "consul-tls-server-name", "", "consul source: the name Consul's certificate must hold, such as server.dc1.consul (default: $CONSUL_TLS_SERVER_NAME, else the address's host)")
	fs.StringVar(&c.mapping, "consul-mapping", "", "consul source: YAML file mapping service names to {vip, port, protocol, nodePort}")
	fs.BoolVar(&c.warningReady, "consul-warning-ready", false, "consul source: instances whose worst check is warning are ready")
	return []string{"consul-addr", "consul-token", "consul-ca-file", "consul-client-cert", "consul-client-key",
		"consul-tls-server-name", "consul-mapping", "consul-warning-ready"}
}

func (c *consulSource) start(s agent.Setup) (agent.Source, error) {
	client, err := consulsource.NewClient(c.client)
	if err != nil {
		return nil, err
	}
	src := &consulsource.Source{Client: client, Logger: s.Logger}
	src.WarningReady = c.warningReady
	if c.mapping != "" {
		if src.Mapping, err = consulsource.LoadMapping(c.mapping); err != nil {
			return nil, err
		}
	}
	return src, nil
}
