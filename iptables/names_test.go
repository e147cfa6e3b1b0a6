//go:build linux

package iptables

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestChainNamesMatchKubeProxy checks the hashes against chain names that
// kube-proxy's own tests expect for service port ns1/svc1:p80 (TCP) and its
// endpoint 10.180.0.1:80.
func TestChainNamesMatchKubeProxy(t *testing.T) {
	sp := &servicelb.ServicePort{
		Key:  servicelb.ServicePortKey{Service: "ns1/svc1", Port: "p80", Family: servicelb.IPv4},
		Port: servicelb.Port{Name: "p80", Protocol: servicelb.TCP, Port: 80},
	}
	n := names{prefix: "KUBE-"}
	if got, want := n.svc(sp), "KUBE-SVC-XPGD46QRK7WJZT7O"; got != want {
		t.Errorf("svc chain %s, want %s", got, want)
	}
	b := servicelb.Backend{Addr: netip.MustParseAddr("10.180.0.1"), Port: 80}
	if got, want := n.sep(sp, b), "KUBE-SEP-SXIVWICOYRO3J4NJ"; got != want {
		t.Errorf("sep chain %s, want %s", got, want)
	}
}

func TestOwns(t *testing.T) {
	kube, sub := names{prefix: "KUBE-"}, names{prefix: "KUBE-X-"}
	for _, tc := range []struct {
		n     names
		chain string
		want  bool
	}{
		{kube, "KUBE-SERVICES", true},
		{kube, "KUBE-SVC-XPGD46QRK7WJZT7O", true},
		{kube, "KUBE-SEP-SXIVWICOYRO3J4NJ", true},
		{kube, "KUBE-FW-SXIVWICOYRO3J4NJ", true},
		{kube, "KUBE-SVC-xpgd46qrk7wjzt7o", false},
		{kube, "KUBE-SVC-XPGD46QRK7WJZT7", false},
		{kube, "KUBE-KUBELET-CANARY", false},
		{kube, "KUBE-FIREWALL", false},
		{kube, "KUBE-LOCALNET-FIREWALL", true},
		{kube, "KUBE-X-SERVICES", false},
		{kube, "KUBE-X-SVC-XPGD46QRK7WJZT7O", false},
		{sub, "KUBE-X-SERVICES", true},
		{sub, "KUBE-SERVICES", false},
		{kube, "PREROUTING", false},
	} {
		if got := tc.n.owns(tc.chain); got != tc.want {
			t.Errorf("%q owns %q = %v, want %v", tc.n.prefix, tc.chain, got, tc.want)
		}
	}
}

func TestOptions(t *testing.T) {
	for _, o := range []Options{
		{ChainPrefix: "kube-"},
		{ChainPrefix: "TOOLONGPRE"},
		{ChainPrefix: "A B"},
		{DropBit: 32},
		{Families: []servicelb.Family{7}},
	} {
		o.conn = offlineConn{}
		if _, err := New(o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%+v): %v, want ErrInvalidOptions", o, err)
		}
	}
}

// TestCapabilitiesFamilies: the Proxier declares the families it
// programs, both by default.
func TestCapabilitiesFamilies(t *testing.T) {
	for _, tc := range []struct {
		families, want []servicelb.Family
	}{
		{nil, []servicelb.Family{servicelb.IPv4, servicelb.IPv6}},
		{[]servicelb.Family{servicelb.IPv6}, []servicelb.Family{servicelb.IPv6}},
	} {
		px, err := New(Options{Families: tc.families, conn: offlineConn{}})
		if err != nil {
			t.Fatal(err)
		}
		c := px.Capabilities()
		if got := c.AddressFamilies(); !slices.Equal(got, tc.want) {
			t.Errorf("Options.Families %v: Capabilities().AddressFamilies() = %v, want %v", tc.families, got, tc.want)
		}
		px.Close()
	}
}
