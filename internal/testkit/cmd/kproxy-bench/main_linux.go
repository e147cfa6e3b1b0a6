//go:build linux

// Command kproxy-bench drives kproxy's backends for the comparison with
// kube-proxy (the bench module, make bench-compare): run in the node's
// network namespace, it loads a generated workload and answers commands
// on its standard input, one JSON line each; probe and serve are the two
// ends of the data-path measurement. It runs in namespaces the bench
// creates and changes nothing else.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kproxy-bench run|probe|serve [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "probe":
		err = probe(os.Args[2:])
	case "serve":
		err = serve(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kproxy-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	backend := fs.String("backend", "nftables", "nftables or iptables")
	n := fs.Int("services", 1000, "services")
	m := fs.Int("endpoints", 10, "endpoints per service")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := newDriver(*backend, *n, *m)
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"digest": d.digest}); err != nil {
		return err
	}
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "quit" {
			return nil
		}
		res, err := d.do(ctx, f)
		if err != nil {
			res = map[string]any{"error": err.Error()}
		}
		if err := out.Encode(res); err != nil {
			return err
		}
	}
	return in.Err()
}
