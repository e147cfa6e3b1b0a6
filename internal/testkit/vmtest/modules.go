//go:build linux

package vmtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// DefaultModuleSelection chooses the kernel modules copied into the guest:
// whole directories (ending in "/") and single modules (by name), each with
// every module it depends on. It covers netfilter with nf_tables,
// nft_compat and the xt matches and targets, ipset, conntrack, NAT, IPVS
// and its schedulers, SCTP, bridge, veth and dummy.
var DefaultModuleSelection = []string{
	"kernel/net/netfilter/",
	"kernel/net/ipv4/netfilter/",
	"kernel/net/ipv6/netfilter/",
	"kernel/net/bridge/",
	"kernel/net/sctp/",
	"dummy", "veth", "bridge", "sctp",
}

// DefaultModules are loaded at boot, before any test runs, so that a test
// finds the features it needs without relying on module autoloading. Other
// modules of the selection still load on demand (the guest has
// /sbin/modprobe). br_netfilter is left out on purpose: it sends bridged
// traffic through iptables and would change what bridge-based test
// topologies see.
var DefaultModules = []string{
	"nf_tables", "nft_compat", "nft_chain_nat", "nft_ct", "nft_nat", "nft_masq",
	"nft_reject_inet", "nft_fib_inet", "nft_numgen", "nft_hash", "nft_limit",
	"nf_conntrack", "nf_conntrack_netlink", "nf_nat",
	"ip_set", "ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip",
	"ip_set_hash_ipportnet", "ip_set_hash_net", "ip_set_bitmap_port",
	"xt_set", "xt_conntrack", "xt_comment", "xt_mark", "xt_addrtype",
	"xt_statistic", "xt_recent", "xt_multiport", "xt_nat", "xt_MASQUERADE",
	"xt_physdev", "ipt_REJECT", "ip6t_REJECT",
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_lc", "ip_vs_wlc", "ip_vs_lblc",
	"ip_vs_lblcr", "ip_vs_dh", "ip_vs_sh", "ip_vs_sed", "ip_vs_nq", "ip_vs_fo",
	"ip_vs_ovf", "ip_vs_mh",
	"dummy", "veth", "bridge", "sctp",
}

// ModuleDeps is a kernel's modules.dep: each module file (relative to
// lib/modules/<release>) and the module files it depends on.
type ModuleDeps map[string][]string

// ParseModuleDeps reads modules.dep as written by depmod.
func ParseModuleDeps(r io.Reader) (ModuleDeps, error) {
	deps := make(ModuleDeps)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	return deps, nil
}

// moduleName is a module file's name as modprobe knows it: base name
// without extension, with '-' read as '_'.
func moduleName(file string) string {
	base := path.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// Closure returns the module files picked by selection (directory
// prefixes ending in "/", or module names) and everything they depend on,
// sorted. A name that matches no module is an error.
func (d ModuleDeps) Closure(selection []string) ([]string, error) {
	picked := make(map[string]bool)
	var visit func(string)
	visit = func(m string) {
		if picked[m] {
			return
		}
		picked[m] = true
		for _, dep := range d[m] {
			visit(dep)
		}
	}
	for _, sel := range selection {
		found := false
		for m := range d {
			if (strings.HasSuffix(sel, "/") && strings.HasPrefix(m, sel)) ||
				moduleName(m) == strings.ReplaceAll(sel, "-", "_") {
				visit(m)
				found = true
			}
		}
		if !found && !strings.HasSuffix(sel, "/") {
			return nil, fmt.Errorf("module %s: not in modules.dep", sel)
		}
	}
	out := make([]string, 0, len(picked))
	for m := range picked {
		out = append(out, m)
	}
	slices.Sort(out)
	return out, nil
}

// AddModules adds the kernel's depmod index files and the selected module
// files of k to l, under usr/lib/modules/<release>.
func AddModules(l *Listing, k *Kernel, selection []string) error {
	dir := k.ModulesDir()
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return fmt.Errorf("modules: %w (run depmod)", err)
	}
	deps, err := ParseModuleDeps(f)
	f.Close()
	if err != nil {
		return err
	}
	files, err := deps.Closure(selection)
	if err != nil {
		return err
	}
	guest := "usr/lib/modules/" + k.Release
	index, err := filepath.Glob(filepath.Join(dir, "modules.*"))
	if err != nil {
		return err
	}
	for _, p := range index {
		l.AddFile(guest+"/"+filepath.Base(p), p, 0o644)
	}
	for _, m := range files {
		l.AddFile(guest+"/"+m, filepath.Join(dir, filepath.FromSlash(m)), 0o644)
	}
	return nil
}
