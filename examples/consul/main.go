// Command consul is a node agent that load-balances Consul services, fed by
// blocking queries on the catalog and on each service's health: an
// instance whose checks pass is ready, a critical one is not, a warning one
// is ready only with --warning-ready, and a deregistered one is gone. Each
// service's virtual address comes from a mapping file (--mapping) or from
// its instances' service meta (kproxy-vip, kproxy-port, kproxy-protocol,
// kproxy-node-port); services with neither are left alone.
//
// It needs a Consul agent's HTTP API (--consul-addr, or $CONSUL_HTTP_ADDR
// and the other CONSUL_* variables), and root (CAP_NET_ADMIN) with the
// chosen backend's kernel support unless --dry-run:
//
//	go run ./examples/consul --consul-addr 127.0.0.1:8500 --mapping examples/consul/mapping.yaml --dry-run
package main

import (
	"flag"
	"fmt"
	"log/slog"

	"github.com/hashicorp/consul/api"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/consulsource"
)

func main() { agent.Main(program()) }

// program is the agent: its flags and its source.
func program() agent.Program {
	var addr, mapping string
	var warningReady bool
	return agent.Program{
		Name: "consul",
		Usage: "consul: a node agent that load-balances Consul services on virtual addresses,\n" +
			"following their health. Needs root unless --dry-run.",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&addr, "consul-addr", "", "Consul HTTP API address (default: $CONSUL_HTTP_ADDR or 127.0.0.1:8500)")
			fs.StringVar(&mapping, "mapping", "", "YAML file mapping service names to {vip, port, protocol, nodePort}")
			fs.BoolVar(&warningReady, "warning-ready", false, "treat instances whose worst check is warning as ready")
		},
		Sources: func(log *slog.Logger) ([]agent.Source, error) {
			cfg := api.DefaultConfig()
			if addr != "" {
				cfg.Address = addr
			}
			c, err := api.NewClient(cfg)
			if err != nil {
				return nil, fmt.Errorf("consul client: %w", err)
			}
			src := &consulsource.Source{Client: c, Logger: log}
			src.WarningReady = warningReady
			if mapping != "" {
				if src.Mapping, err = consulsource.LoadMapping(mapping); err != nil {
					return nil, err
				}
			}
			return []agent.Source{src}, nil
		},
	}
}
