// Command static is a node agent that load-balances the services listed in
// a YAML or JSON file (schema: examples/internal/filesource; a commented
// example: examples/static/services.yaml). It validates the file, naming
// the file, line and field of each mistake, applies it with the chosen
// backend, then watches the file and applies only what changed. An edit
// that does not parse changes nothing; an invalid service is reported and
// keeps its last good version while the others are applied.
//
// It needs root (CAP_NET_ADMIN) and the kernel support of the chosen
// backend, except with --dry-run, which prints the rules and installs
// nothing:
//
//	go run ./examples/static --file examples/static/services.yaml --dry-run --once
package main

import (
	"errors"
	"flag"
	"log/slog"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/filesource"
)

func main() { agent.Main(program()) }

// program is the agent: its flags and its source.
func program() agent.Program {
	var file string
	return agent.Program{
		Name: "static",
		Usage: "static: a node agent that load-balances the services of a YAML or JSON file,\n" +
			"applying each change to the file as it is saved. Needs root unless --dry-run.",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&file, "file", "", "services file, YAML or JSON (required)")
		},
		Sources: func(log *slog.Logger) ([]agent.Source, error) {
			if file == "" {
				return nil, errors.New("--file is required")
			}
			return []agent.Source{&filesource.Source{Path: file, Logger: log}}, nil
		},
	}
}
