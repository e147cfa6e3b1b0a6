//go:build linux

package xtables

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPods: each local-traffic detection restricts a rule to the pods'
// flows (kube-proxy's IfLocal) and to the others (IfNotLocal) as
// kube-proxy writes them.
func TestPods(t *testing.T) {
	pfx := netip.MustParsePrefix
	base := Rule{Dst: pfx("10.96.0.1/32"), Target: Jump("X")}
	save := func(rs ...Rule) []string {
		out := []string{}
		for _, r := range rs {
			out = append(out, string(r.AppendSave(nil, IPv4, "C")))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		m    Local
		pods []string
		not  string // "" when no one rule says it
	}{
		{"none", Local{}, []string{}, ""},
		{"one prefix", Local{CIDRs: []netip.Prefix{pfx("10.244.0.0/16")}},
			[]string{"-A C -s 10.244.0.0/16 -d 10.96.0.1/32 -j X"}, "-A C ! -s 10.244.0.0/16 -d 10.96.0.1/32 -j X"},
		{"two prefixes", Local{CIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("10.244.9.0/24")}},
			[]string{"-A C -s 10.244.1.0/24 -d 10.96.0.1/32 -j X", "-A C -s 10.244.9.0/24 -d 10.96.0.1/32 -j X"}, ""},
		{"bridge", Local{Interface: "cbr0"},
			[]string{"-A C -d 10.96.0.1/32 -i cbr0 -j X"}, "-A C -d 10.96.0.1/32 ! -i cbr0 -j X"},
		{"name prefix", Local{Interface: "veth", Prefix: true},
			[]string{"-A C -d 10.96.0.1/32 -i veth+ -j X"}, "-A C -d 10.96.0.1/32 ! -i veth+ -j X"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.pods, save(Pods(tc.m, base)...))
			not, ok := NotPods(tc.m, base)
			assert.Equal(t, tc.not != "", ok)
			if ok {
				assert.Equal(t, []string{tc.not}, save(not))
			}
		})
	}
}
