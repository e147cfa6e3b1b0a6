package servicelb

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func addrList(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

// TestNodePortIPs: which addresses serve node ports, by kube-proxy's
// nodePortAddresses: every local address by default, the addresses inside
// CIDRs, the node's primary IPs with "primary"; each family apart, so
// that a family without a CIDR (or, with "primary", without a node IP)
// serves every address of it; and 127.0.0.1 with localhost node ports,
// unless the IPv4 selection leaves the loopback network out.
func TestNodePortIPs(t *testing.T) {
	base := NodeConfig{
		NodeIPs:  addrList("192.0.2.1", "2001:db8::1"),
		LocalIPs: addrList("10.0.0.5", "192.0.2.1", "198.51.100.7", "2001:db8:1::5"),
	}
	every4, every6 := []string{"192.0.2.1", "10.0.0.5", "198.51.100.7"}, []string{"2001:db8::1", "2001:db8:1::5"}
	for _, tc := range []struct {
		name  string
		edit  func(n *NodeConfig)
		want4 []string
		want6 []string
	}{
		{"every local address", func(*NodeConfig) {}, every4, every6},
		{"no local addresses known", func(n *NodeConfig) { n.LocalIPs = nil }, []string{"192.0.2.1"}, []string{"2001:db8::1"}},
		{"CIDRs", func(n *NodeConfig) {
			n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/64")}
		}, []string{"10.0.0.5"}, []string{"2001:db8::1"}},
		{"IPv4 CIDRs leave IPv6 to every address", func(n *NodeConfig) {
			n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
		}, []string{"198.51.100.7"}, every6},
		{"IPv6 CIDRs leave IPv4 to every address", func(n *NodeConfig) {
			n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}
		}, every4, []string{"2001:db8:1::5"}},
		{"a CIDR holding no address serves none", func(n *NodeConfig) {
			n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:2::/48")}
		}, nil, nil},
		{"primary", func(n *NodeConfig) { n.NodePortPrimary = true }, []string{"192.0.2.1"}, []string{"2001:db8::1"}},
		{"primary without an IPv6 node IP leaves IPv6 to every address", func(n *NodeConfig) {
			n.NodePortPrimary, n.NodeIPs = true, addrList("192.0.2.1")
		}, []string{"192.0.2.1"}, []string{"2001:db8:1::5"}},
		{"localhost", func(n *NodeConfig) { n.LocalhostNodePorts = true },
			append(slices.Clone(every4), "127.0.0.1"), every6},
		{"localhost, and CIDRs that hold 127.0.0.0", func(n *NodeConfig) {
			n.LocalhostNodePorts, n.NodePortAddresses = true, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")}
		}, []string{"10.0.0.5", "127.0.0.1"}, every6},
		{"localhost, and CIDRs that leave loopback out", func(n *NodeConfig) {
			n.LocalhostNodePorts, n.NodePortAddresses = true, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
		}, []string{"10.0.0.5"}, every6},
		{"localhost, and IPv6 CIDRs alone", func(n *NodeConfig) {
			n.LocalhostNodePorts, n.NodePortAddresses = true, []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}
		}, append(slices.Clone(every4), "127.0.0.1"), []string{"2001:db8:1::5"}},
		{"localhost, and primary", func(n *NodeConfig) { n.NodePortPrimary, n.LocalhostNodePorts = true, true },
			[]string{"192.0.2.1"}, []string{"2001:db8::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base
			tc.edit(&n)
			require.NoError(t, ValidateNode(&n))
			assert.Equal(t, addrList(tc.want4...), n.NodePortIPs(IPv4))
			assert.Equal(t, addrList(tc.want6...), n.NodePortIPs(IPv6))
			assert.Equal(t, slices.Contains(tc.want4, "127.0.0.1"), n.ServesLocalhost())
		})
	}
}

// TestNodePortPrimaryStandsAlone: a node with "primary" and CIDRs is
// refused, as kube-proxy refuses them together.
func TestNodePortPrimaryStandsAlone(t *testing.T) {
	n := NodeConfig{NodeIPs: addrList("192.0.2.1"), NodePortPrimary: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	err := ValidateNode(&n)
	require.ErrorIs(t, err, ErrInvalidNode)
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "nodePortPrimary", ve.Field)
	_, err = NewBuilder(n)
	require.ErrorIs(t, err, ErrInvalidNode)
}

// TestParseNodePortAddresses follows kube-proxy's validation of
// nodePortAddresses: "primary" alone or CIDRs, each parsed as
// Kubernetes' ParseCIDRSloppy parses them.
func TestParseNodePortAddresses(t *testing.T) {
	prefixes := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		in      []string
		want    []netip.Prefix
		primary bool
	}{
		{"none", nil, nil, false},
		{"primary", []string{"primary"}, nil, true},
		{"CIDRs of both families", []string{"10.0.0.0/8", "2001:db8::/32"}, prefixes("10.0.0.0/8", "2001:db8::/32"), false},
		{"host bits dropped", []string{"10.0.0.1/8", "2001:db8::1/32"}, prefixes("10.0.0.0/8", "2001:db8::/32"), false},
		{"leading zeros", []string{"010.000.001.002/024", "::ffff:0:0:010.0.0.1/120"}, prefixes("10.0.1.0/24", "::ffff:0:0:a00:0/120"), false},
		{"a host", []string{"192.0.2.1/32"}, prefixes("192.0.2.1/32"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, primary, err := ParseNodePortAddresses(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.primary, primary)
			assert.Equal(t, tc.want, ps)
		})
	}
	for _, tc := range []struct {
		name   string
		in     []string
		kind   error
		fields []string
	}{
		{"primary beside a CIDR", []string{"10.0.0.0/8", "primary"}, ErrInvalidNode, []string{"nodePortAddresses[1]"}},
		{"primary first beside a CIDR", []string{"primary", "10.0.0.0/8"}, ErrInvalidNode, []string{"nodePortAddresses[0]"}},
		{"primary twice", []string{"primary", "primary"}, ErrInvalidNode, []string{"nodePortAddresses[0]"}},
		{"misspelt keyword", []string{"Primary"}, ErrInvalidPrefix, []string{"nodePortAddresses[0]"}},
		{"an address without a length", []string{"10.0.0.1"}, ErrInvalidPrefix, []string{"nodePortAddresses[0]"}},
		{"a length too long", []string{"10.0.0.0/33", "2001:db8::/129"}, ErrInvalidPrefix, []string{"nodePortAddresses[0]", "nodePortAddresses[1]"}},
		{"an IPv4 number too large", []string{"10.0.0.256/32"}, ErrInvalidPrefix, []string{"nodePortAddresses[0]"}},
		{"empty", []string{""}, ErrInvalidPrefix, []string{"nodePortAddresses[0]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps, primary, err := ParseNodePortAddresses(tc.in)
			require.ErrorIs(t, err, tc.kind)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			for _, f := range tc.fields {
				assert.Contains(t, err.Error(), f)
			}
			assert.Nil(t, ps, "nothing taken from a bad list")
			assert.False(t, primary)
		})
	}
}

// TestLocalhostNodePortsNeedTheFeature: a node that asks for localhost node
// ports is refused by a backend without the feature, before anything is
// applied: by Require, and by SetNode once required.
func TestLocalhostNodePortsNeedTheFeature(t *testing.T) {
	without := Capabilities{Backend: "nftables", Features: AllFeatures &^ FeatureLocalhostNodePorts}
	with := Capabilities{Backend: "iptables", Features: AllFeatures}
	local := NodeConfig{NodeIPs: addrList("192.0.2.1"), LocalhostNodePorts: true}
	require.NoError(t, with.CheckNode(&local))
	err := without.CheckNode(&local)
	require.ErrorIs(t, err, ErrUnsupported)
	assert.Contains(t, err.Error(), "localhostNodePorts")

	b, err := NewBuilder(local)
	require.NoError(t, err)
	require.ErrorIs(t, b.Require(without), ErrUnsupported)
	b, err = NewBuilder(NodeConfig{NodeIPs: addrList("192.0.2.1")})
	require.NoError(t, err)
	require.NoError(t, b.Require(without))
	require.ErrorIs(t, b.SetNode(local), ErrUnsupported)
	assert.False(t, b.State().Node().LocalhostNodePorts, "a refused node was taken")
}

// TestLocalIPsValidated: the local addresses are checked as the node IPs.
func TestLocalIPsValidated(t *testing.T) {
	n := NodeConfig{LocalIPs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}}
	err := ValidateNode(&n)
	require.ErrorIs(t, err, ErrInvalidAddress)
	assert.Contains(t, err.Error(), "localIPs[0]")
}
