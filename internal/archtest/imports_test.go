package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is the import path of the core module; "~" stands for it in the
// rules' patterns. The Kubernetes layer's and the examples' modules lie
// under it, so "~/..." covers all three.
const module = "github.com/kproxy-dev/kproxy"

// Pattern groups of the rules.
var (
	dataplanes = []string{"~/nftables", "~/iptables", "~/ipvs", "~/userspace", "~/ebpf"}
	primitives = []string{"~/ipset", "~/conntrack", "~/nodeaddr"}
	netlink    = []string{"~/internal/nfnl", "~/internal/nl", "~/internal/rtnl", "~/internal/ipvsnl"}
	// kits are the test kits and tools: the internal wing, and the public
	// kits that embedders' tests use (the conformance kit, and the bpf
	// environment that socket balancing is tried in).
	kits = []string{"~/internal/testkit/...", "~/servicelb/conformance", "~/ebpf/ebpftest"}
)

// A rule forbids the packages From (but those of Except) to depend, through
// the imports of their non-test files, on a package of To (but those of
// Allow): directly or not, or with Direct, by an import of their own.
// Patterns are import paths, "~" the module's, and a trailing "/..."
// takes a whole subtree.
type rule struct {
	Name         string
	From, Except []string
	To, Allow    []string
	Direct       bool
	Why          string
}

// rules are the module's layering, each with its reason.
var rules = []rule{
	{
		Name: "servicelb is a leaf",
		From: []string{"~/servicelb", "~/servicelb/fake"},
		To: []string{"~/...", "k8s.io/...", "github.com/hashicorp/...", "golang.org/x/sys/unix",
			"github.com/vishvananda/...", "github.com/google/nftables/...", "github.com/mdlayher/...", "syscall/js"},
		Allow: []string{"~/servicelb"},
		Why: "servicelb is the model every backend and every embedder shares: it decides the semantics once, " +
			"builds on every platform, and knows no kernel, no dataplane, no Kubernetes and no Consul",
	},
	{
		Name: "no dataplane depends on another",
		From: dataplanes, To: dataplanes,
		Why: "each dataplane renders servicelb's decisions alone, so that a change to one never moves another; " +
			"pairing two (ebpf's socket hooks with nftables' packet rules) is the caller's, through Options",
	},
	{
		Name: "nothing that ships depends on a kit",
		From: []string{"~/..."}, Except: append(slices.Clone(kits), "~/examples/demo"),
		To: kits,
		Why: "the kits make namespaces, mounts, servers and random services for tests: what ships never carries " +
			"them or their dependencies into an embedder's build. The sandbox demo, which is not shipped and runs " +
			"in namespaces and mounts of its own, may use the public kits",
	},
	{
		Name: "the examples' kits stay in their tests",
		From: []string{"~/examples/..."}, Except: []string{"~/examples/internal/e2e", "~/examples/internal/testutil"},
		To:  []string{"~/examples/internal/e2e", "~/examples/internal/testutil"},
		Why: "the examples' end-to-end harness and test helpers serve their tests, never the binaries",
	},
	{
		Name: "the wire knows no model",
		From: append(slices.Clone(netlink), "~/internal/xtables"),
		To:   []string{"~/servicelb/..."},
		Why: "the netlink stack and the xtables encoder speak the kernel's objects; a backend translates the " +
			"model into them, so that a change of the model never reaches the wire",
	},
	{
		Name: "netlink is spoken by the kernel's programmers",
		From: []string{"~/..."}, Except: slices.Concat(dataplanes, primitives, netlink, kits, []string{"~/internal/xtables"}),
		To: netlink, Direct: true,
		Why: "one netlink stack, used by the packages that program the kernel: the engine, servicelb, the servers " +
			"and the agents ask those packages, and never frame a message of their own",
	},
	{
		Name: "one netlink framing",
		From: []string{"~/..."}, Except: slices.Concat(kits, []string{"~/examples/demo", "~/examples/internal/sandbox"}),
		To:     []string{"github.com/mdlayher/netlink/...", "github.com/vishvananda/netlink/..."},
		Direct: true,
		Why: "every family the product speaks goes through internal/nl, which frames in the host's byte order, " +
			"reads every acknowledgement and ends every dump one way; the kits and the demo's sandbox, which build " +
			"test topologies (veths, bridges, routes), may use a general library",
	},
	{
		Name: "the examples and the Kubernetes layer use public packages",
		From: []string{"~/examples/...", "~/kube/..."},
		To:   []string{"~/internal/..."}, Direct: true,
		Why: "they are what embedders read and copy, and modules of their own: an import of the core's internal " +
			"packages builds in this repository only",
	},
	{
		Name: "the Kubernetes layer programs nothing",
		From: []string{"~/kube/..."},
		To:   slices.Concat(dataplanes, primitives, []string{"~/healthcheck"}),
		Why: "kube converts Kubernetes' objects and configuration into servicelb's model; which dataplane runs " +
			"them is the agent's choice",
	},
}

// match reports whether the import path p matches the pattern.
func match(pattern, p string) bool {
	pattern = strings.Replace(pattern, "~", module, 1)
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return p == base || strings.HasPrefix(p, base+"/")
	}
	return p == pattern
}

func matchAny(patterns []string, p string) bool {
	return slices.ContainsFunc(patterns, func(pat string) bool { return match(pat, p) })
}

// pkg is a package of the import graph: its non-test imports.
type pkg struct {
	ImportPath string
	Imports    []string
}

// graph is the import graph of the module's packages and their
// dependencies; mine lists the module's own packages.
type graph struct {
	pkgs map[string]*pkg
	mine []string
}

// loadGraph lists the three modules' packages (the workspace joins them)
// and their dependencies, with every build tag of the tests, so that a
// file built only for some of them is seen too.
func loadGraph(t *testing.T) *graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-deps", "-tags", "privileged,vm,soak", "-json=ImportPath,Imports,DepOnly,Error",
		module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	g := &graph{pkgs: map[string]*pkg{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			pkg
			DepOnly bool
			Error   *struct{ Err string }
		}
		require.NoError(t, dec.Decode(&p))
		require.Nil(t, p.Error, "go list %s", p.ImportPath)
		g.pkgs[p.ImportPath] = &p.pkg
		if !p.DepOnly {
			g.mine = append(g.mine, p.ImportPath)
		}
	}
	require.NotEmpty(t, g.mine)
	return g
}

// path returns a chain of imports from a package to each of its
// dependencies, shortest first: path[d] is the package through which d
// was first reached (the from package itself for a direct import).
func (g *graph) paths(from string) map[string]string {
	via := map[string]string{}
	queue := []string{from}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		node := g.pkgs[p]
		if node == nil {
			continue
		}
		for _, d := range node.Imports {
			if _, seen := via[d]; seen || d == from {
				continue
			}
			via[d] = p
			queue = append(queue, d)
		}
	}
	return via
}

// chain spells the imports from from to d.
func chain(from, d string, via map[string]string) string {
	short := func(p string) string {
		if p == module {
			return "~"
		}
		return strings.Replace(p, module+"/", "", 1)
	}
	hops := []string{short(d)}
	for p := via[d]; p != from; p = via[p] {
		hops = append(hops, short(p))
	}
	hops = append(hops, short(from))
	slices.Reverse(hops)
	return strings.Join(hops, " → ")
}

// violation is a broken rule.
type violation struct {
	Rule, From, To, Chain string
}

func (v violation) String() string { return fmt.Sprintf("%s: %s", v.Rule, v.Chain) }

// check returns every dependency that breaks a rule.
func (g *graph) check(rules []rule) []violation {
	var out []violation
	for _, from := range g.mine {
		var via map[string]string
		for _, r := range rules {
			if !matchAny(r.From, from) || matchAny(r.Except, from) {
				continue
			}
			reach := map[string]string{}
			if r.Direct {
				for _, d := range g.pkgs[from].Imports {
					reach[d] = from
				}
			} else {
				if via == nil {
					via = g.paths(from)
				}
				reach = via
			}
			for _, d := range slices.Sorted(maps.Keys(reach)) {
				if matchAny(r.To, d) && !matchAny(r.Allow, d) && d != from {
					out = append(out, violation{Rule: r.Name, From: from, To: d, Chain: chain(from, d, reach)})
				}
			}
		}
	}
	return out
}

// TestImportRules holds the module to its rules.
func TestImportRules(t *testing.T) {
	g := loadGraph(t)
	for _, v := range g.check(rules) {
		i := slices.IndexFunc(rules, func(r rule) bool { return r.Name == v.Rule })
		t.Errorf("%s\n\tbecause %s", v, rules[i].Why)
	}
}

// TestImportRulesFail breaks each rule in a copy of the module's graph, by
// an import from a package the rule binds to one it forbids, and requires
// the check to name that rule and that import: no rule holds only because
// it can match nothing.
func TestImportRulesFail(t *testing.T) {
	g := loadGraph(t)
	require.Zero(t, len(g.check(rules)), "the module breaks rules: see TestImportRules")
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			from, to := pick(t, g, r)
			broken := &graph{pkgs: map[string]*pkg{}, mine: g.mine}
			for p, node := range g.pkgs {
				broken.pkgs[p] = node
			}
			node := *g.pkgs[from]
			node.Imports = append(slices.Clone(node.Imports), to)
			broken.pkgs[from] = &node
			got := broken.check(rules)
			require.NotEmpty(t, got, "%s importing %s breaks no rule", from, to)
			assert.Contains(t, got, violation{Rule: r.Name, From: from, To: to, Chain: chain(from, to, map[string]string{to: from})},
				"%s importing %s", from, to)
		})
	}
}

// pick returns a package of the module the rule binds, and one it must not
// depend on: a package of the module, or an outside one the module uses.
func pick(t *testing.T, g *graph, r rule) (from, to string) {
	t.Helper()
	for _, p := range g.mine {
		if matchAny(r.From, p) && !matchAny(r.Except, p) {
			from = p
			break
		}
	}
	require.NotEmpty(t, from, "rule %q binds no package", r.Name)
	var all []string
	for p := range g.pkgs {
		all = append(all, p)
	}
	slices.Sort(all)
	for _, p := range all {
		if p != from && matchAny(r.To, p) && !matchAny(r.Allow, p) {
			return from, p
		}
	}
	t.Fatalf("rule %q forbids no package there is", r.Name)
	return "", ""
}
