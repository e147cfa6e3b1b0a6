package servicelb

import (
	"net/netip"
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
// CIDRs, the node's primary IPs with "primary", 127.0.0.1 with localhost
// node ports.
func TestNodePortIPs(t *testing.T) {
	base := NodeConfig{
		NodeIPs:  addrList("192.0.2.1", "2001:db8::1"),
		LocalIPs: addrList("10.0.0.5", "192.0.2.1", "198.51.100.7", "2001:db8:1::5"),
	}
	for _, tc := range []struct {
		name  string
		edit  func(n *NodeConfig)
		want4 []string
		want6 []string
	}{
		{"every local address", func(*NodeConfig) {}, []string{"192.0.2.1", "10.0.0.5", "198.51.100.7"}, []string{"2001:db8::1", "2001:db8:1::5"}},
		{"no local addresses known", func(n *NodeConfig) { n.LocalIPs = nil }, []string{"192.0.2.1"}, []string{"2001:db8::1"}},
		{"CIDRs", func(n *NodeConfig) {
			n.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/64")}
		}, []string{"10.0.0.5"}, []string{"2001:db8::1"}},
		{"primary", func(n *NodeConfig) { n.NodePortPrimary = true }, []string{"192.0.2.1"}, []string{"2001:db8::1"}},
		{"primary and a CIDR", func(n *NodeConfig) {
			n.NodePortPrimary, n.NodePortAddresses = true, []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
		}, []string{"192.0.2.1", "198.51.100.7"}, []string{"2001:db8::1"}},
		{"localhost", func(n *NodeConfig) { n.NodePortPrimary, n.LocalhostNodePorts = true, true },
			[]string{"192.0.2.1", "127.0.0.1"}, []string{"2001:db8::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := base
			tc.edit(&n)
			require.NoError(t, ValidateNode(&n))
			assert.Equal(t, addrList(tc.want4...), n.NodePortIPs(IPv4))
			assert.Equal(t, addrList(tc.want6...), n.NodePortIPs(IPv6))
		})
	}
}

func TestParseNodePortAddresses(t *testing.T) {
	ps, primary, err := ParseNodePortAddresses([]string{"10.0.0.0/8", "primary", "2001:db8::/32"})
	require.NoError(t, err)
	assert.True(t, primary)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}, ps)
	ps, primary, err = ParseNodePortAddresses(nil)
	require.NoError(t, err)
	assert.False(t, primary)
	assert.Empty(t, ps)
	_, _, err = ParseNodePortAddresses([]string{"10.0.0.1/8", "Primary"})
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	assert.ErrorIs(t, err, ErrInvalidPrefix)
	assert.Contains(t, err.Error(), "nodePortAddresses[0]")
	assert.Contains(t, err.Error(), "nodePortAddresses[1]")
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
