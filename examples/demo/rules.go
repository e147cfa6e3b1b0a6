package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/examples/internal/agent"
	"github.com/kproxy-dev/kproxy/examples/internal/sandbox"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// listers are the tools that show what the kernel holds, per backend, run
// inside the sandbox node's namespace. They are optional: without them the
// demo shows the backend's own rendering of what it applied.
var listers = map[string][]string{
	"nftables": {"nft", "list", "table", "inet", nftables.DefaultTable},
	"iptables": {"iptables-nft-save", "-t", "nat"},
	"ipvs":     {"ipvsadm", "-Ln"},
}

// showRules prints the rules of the demo's services: read back from the
// kernel with the dataplane's own tool when it is installed, else as the
// backend renders the state it applied.
func showRules(ctx context.Context, out io.Writer, a *agent.Agent, backend string, sb *sandbox.Sandbox, svcs []servicelb.Service) error {
	title, text, err := kernelRules(ctx, backend, sb)
	if d, ok := a.Dataplane().(dumper); ok && err != nil {
		if text, err = d.Dump(ctx); err != nil {
			return fmt.Errorf("read the maps back: %w", err)
		}
		title = "Maps as the kernel now holds them (read back by the backend; the nftables table beside them is nftables')"
	}
	if err != nil {
		r, ok := a.Dataplane().(servicelb.Renderer)
		if !ok {
			return nil
		}
		if text, err = r.Render(a.Runner().Applied()); err != nil {
			return fmt.Errorf("render the rules: %w", err)
		}
		title = "Rules installed, as the backend renders them"
		if l, ok := listers[backend]; ok {
			title += " (install " + l[0] + " to read them back from the kernel)"
		} else if backend == "userspace" {
			title = "What the backend serves, as it renders it (it installs no rules: its listeners take the traffic)"
		}
	}
	lines := relevant(backend, text, svcs)
	switch backend {
	case "nftables":
		title += ", empty sets and maps left out"
	case "iptables":
		title += ", the services' rules"
	}
	fmt.Fprintf(out, "\n%s:\n", title)
	for _, l := range lines {
		fmt.Fprintf(out, "  %s\n", l)
	}
	return nil
}

// dumper is a backend that reads its kernel state back itself (ebpf).
type dumper interface {
	Dump(ctx context.Context) (string, error)
}

// kernelRules runs the backend's listing tool in the node's namespace.
func kernelRules(ctx context.Context, backend string, sb *sandbox.Sandbox) (string, string, error) {
	argv, ok := listers[backend]
	if !ok {
		return "", "", fmt.Errorf("no lister for %s", backend)
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return "", "", err
	}
	var b []byte
	err := sandbox.In(sb.Node.NS, func() error {
		var err error
		b, err = exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
		return err
	})
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	title := fmt.Sprintf("Rules as the kernel now holds them (%s, in the node's namespace)", strings.Join(argv, " "))
	return title, string(b), nil
}

// relevant keeps the output short: for iptables, the rules that name one
// of the services (the IPv4 nat table's service, endpoint and node port
// rules); for nftables, the table without its empty sets and maps; other
// listings whole.
func relevant(backend, text string, svcs []servicelb.Service) []string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	switch backend {
	case "nftables":
		return withoutEmptySets(lines)
	case "iptables":
	default:
		return lines
	}
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "# ip6tables") {
			break // the rendering's IPv6 half; the demo is IPv4
		}
		for _, s := range svcs {
			if strings.Contains(l, `"`+s.Name+":") {
				out = append(out, l)
				break
			}
		}
	}
	return out
}

// withoutEmptySets drops the set and map blocks of an nft listing that
// hold no elements, and the blank lines between blocks.
func withoutEmptySets(lines []string) []string {
	var out, block []string
	inSet := false
	for _, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case inSet:
			block = append(block, l)
			if l == "\t}" {
				inSet = false
				if slices.ContainsFunc(block, func(b string) bool { return strings.Contains(b, "elements = ") }) {
					out = append(out, block...)
				}
			}
		case strings.HasPrefix(l, "\tset ") || strings.HasPrefix(l, "\tmap "):
			inSet, block = true, []string{l}
		case t != "":
			out = append(out, l)
		}
	}
	return out
}
