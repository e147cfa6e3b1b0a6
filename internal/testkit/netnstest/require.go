//go:build linux

package netnstest

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// probe checks one kernel feature from a thread inside a throwaway
// network namespace.
type probe struct {
	check func() error
	hint  string
}

// probes maps the feature names Require accepts to their checks.
func probes() map[string]probe {
	return map[string]probe{
		"netns":      {func() error { return nil }, "cannot create network namespaces"},
		"nf_tables":  {probeNFTables, "kernel without nf_tables (CONFIG_NF_TABLES)"},
		"nft_compat": {probeNFTCompat, "kernel without nft_compat and xt_comment (CONFIG_NFT_COMPAT)"},
		"nat":        {probeNAT, "kernel without nf_tables NAT (CONFIG_NFT_NAT, CONFIG_NF_NAT)"},
		"ipset":      {probeIPSet, "kernel without ipset hash:ip (CONFIG_IP_SET_HASH_IP)"},
		"conntrack":  {probeConntrack, "kernel without conntrack netlink (CONFIG_NF_CT_NETLINK)"},
		"ip_vs":      {probeIPVS, "kernel without IPVS (CONFIG_IP_VS) or module ip_vs not loaded"},
		"dummy":      {probeDummy, "kernel without dummy links (CONFIG_DUMMY) or module dummy not loaded"},
		"veth":       {probeVeth, "kernel without veth (CONFIG_VETH)"},
		"bridge":     {probeBridge, "kernel without bridges (CONFIG_BRIDGE)"},
		"sctp":       {probeSCTP, "kernel without SCTP (CONFIG_IP_SCTP) or module sctp not loaded"},
	}
}

// Features returns the feature names Require accepts, sorted.
func Features() []string {
	var out []string
	for name := range probes() {
		out = append(out, name)
	}
	sort.Strings(out)
	return append([]string{"root"}, out...)
}

// Require skips the test unless it runs as root and the kernel has every
// named feature ("root" is implied; see Features for the names). Each
// feature is probed for real in a throwaway network namespace: creating an
// nf_tables table, an ipset, a dummy link, an SCTP socket, and so on. When
// the environment variable CI is true, a missing feature fails the test
// instead: under CI a test that cannot run must not pass silently. An
// unknown feature name always fails the test.
func Require(t testing.TB, features ...string) {
	t.Helper()
	if err := checkNames(features); err != nil {
		t.Fatalf("netnstest.Require: %v", err)
	}
	report(t, missing(features))
}

// Missing returns why the named features are not all available, probed
// as Require probes them, or "" when they are: for a test that checks
// what a backend's own probe finds against it.
// An unknown feature name fails the test.
func Missing(t testing.TB, features ...string) string {
	t.Helper()
	if err := checkNames(features); err != nil {
		t.Fatalf("netnstest.Missing: %v", err)
	}
	return missing(features)
}

// report skips the test, or fails it under CI=true, if reason is not "".
func report(t testing.TB, reason string) {
	t.Helper()
	if reason == "" {
		return
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatalf("netnstest: cannot run under CI=true: %s", reason)
	}
	t.Skipf("netnstest: skipped: %s", reason)
}

// checkNames rejects unknown feature names.
func checkNames(features []string) error {
	known := probes()
	for _, f := range features {
		if _, ok := known[f]; !ok && f != "root" {
			return fmt.Errorf("unknown feature %q (known: %s)", f, strings.Join(Features(), ", "))
		}
	}
	return nil
}

// missing returns why the features are not all available, or "".
func missing(features []string) string {
	known := probes()
	if os.Geteuid() != 0 {
		return "needs root (network namespaces, netlink writes)"
	}
	features = slices.DeleteFunc(slices.Clone(features), func(f string) bool { return f == "root" })
	if len(features) == 0 {
		return ""
	}
	var reasons []string
	err := inNewNamespace(func() error {
		for _, f := range features {
			if err := known[f].check(); err != nil {
				reasons = append(reasons, fmt.Sprintf("%s: %s: %v", f, known[f].hint, err))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Sprintf("netns: cannot create a network namespace: %v", err)
	}
	return strings.Join(reasons, "; ")
}

func probeNFTables() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tab := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "kpt_probe"})
	if err := c.Flush(); err != nil {
		return err
	}
	c.DelTable(tab)
	return c.Flush()
}

func probeNFTCompat() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tab := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "kpt_probe_compat"})
	ch := c.AddChain(&nftables.Chain{Name: "probe", Table: tab})
	comment := xt.Comment("probe")
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{
		&expr.Match{Name: "comment", Rev: 0, Info: &comment},
	}})
	return c.Flush()
}

func probeNAT() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tab := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "kpt_probe_nat"})
	ch := c.AddChain(&nftables.Chain{Name: "post", Table: tab, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: []expr.Any{&expr.Masq{}}})
	return c.Flush()
}

func probeIPSet() error {
	if err := netlink.IpsetCreate("kpt-probe", "hash:ip", netlink.IpsetCreateOptions{Family: unix.AF_INET}); err != nil {
		return err
	}
	return netlink.IpsetDestroy("kpt-probe")
}

func probeConntrack() error {
	_, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	return err
}

func probeIPVS() error {
	_, err := netlink.GenlFamilyGet("IPVS")
	return err
}

func probeDummy() error {
	la := netlink.NewLinkAttrs()
	la.Name = "kptprobe0"
	return netlink.LinkAdd(&netlink.Dummy{LinkAttrs: la})
}

func probeVeth() error {
	la := netlink.NewLinkAttrs()
	la.Name = "kptprobe1"
	return netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "kptprobe2"})
}

func probeBridge() error {
	la := netlink.NewLinkAttrs()
	la.Name = "kptprobe3"
	return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la})
}

func probeSCTP() error {
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
}
