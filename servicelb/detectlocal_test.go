package servicelb

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	cluster4  = netip.MustParsePrefix("10.244.0.0/16")
	cluster6  = netip.MustParsePrefix("fd00:244::/32")
	nodeCIDR4 = netip.MustParsePrefix("10.244.7.0/24")
	nodeCIDR6 = netip.MustParsePrefix("fd00:244:7::/64")
)

// TestValidateDetectLocal: each mode with its parameter is valid, and
// every mistake is a *ValidationError naming the field, wrapping its kind.
func TestValidateDetectLocal(t *testing.T) {
	valid := []NodeConfig{
		{},
		{ClusterCIDRs: []netip.Prefix{cluster4}},
		{ClusterCIDRs: []netip.Prefix{cluster4}, DetectLocal: DetectLocal{Mode: LocalByClusterCIDR}},
		{DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}}},
		{ClusterCIDRs: []netip.Prefix{cluster4}, DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4, nodeCIDR6}}},
		{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"}},
		{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: strings.Repeat("b", MaxInterfaceNameLen)}},
		{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}},
		{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "vxlan.calico"}},
		{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: strings.Repeat("v", MaxInterfacePrefixLen)}},
	}
	for _, n := range valid {
		assert.NoError(t, ValidateNode(&n), "%+v", n.DetectLocal)
	}

	for _, tt := range []struct {
		name   string
		node   NodeConfig
		kind   error
		field  string
		substr string
	}{
		{"unknown mode", NodeConfig{DetectLocal: DetectLocal{Mode: "Cluster"}}, ErrInvalidNode, "detectLocal.mode", "unknown mode"},
		{"explicit ClusterCIDR without cluster CIDRs", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByClusterCIDR}},
			ErrInvalidNode, "clusterCIDRs", "mode ClusterCIDR needs them"},
		{"NodeCIDR without node CIDRs", NodeConfig{ClusterCIDRs: []netip.Prefix{cluster4}, DetectLocal: DetectLocal{Mode: LocalByNodeCIDR}},
			ErrInvalidNode, "detectLocal.nodeCIDRs", "missing"},
		{"malformed node CIDR", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.1/24")}}},
			ErrInvalidPrefix, "detectLocal.nodeCIDRs[0]", "host bits"},
		{"invalid node CIDR", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{{}}}},
			ErrInvalidPrefix, "detectLocal.nodeCIDRs[0]", "missing"},
		{"BridgeInterface without a bridge", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface}},
			ErrInvalidNode, "detectLocal.bridgeInterface", "missing"},
		{"InterfaceNamePrefix without a prefix", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix}},
			ErrInvalidNode, "detectLocal.interfaceNamePrefix", "missing"},
		{"bridge name too long", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: strings.Repeat("b", MaxInterfaceNameLen+1)}},
			ErrNameTooLong, "detectLocal.bridgeInterface", "16 bytes, at most 15"},
		{"prefix too long", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: strings.Repeat("v", MaxInterfaceNameLen)}},
			ErrNameTooLong, "detectLocal.interfaceNamePrefix", "15 bytes, at most 14"},
		{"bridge name with a slash", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "br/0"}},
			ErrInvalidName, "detectLocal.bridgeInterface", "not an interface name"},
		{"bridge name with a wildcard", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr+"}},
			ErrInvalidName, "detectLocal.bridgeInterface", ""},
		{"prefix with a wildcard", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth*"}},
			ErrInvalidName, "detectLocal.interfaceNamePrefix", ""},
		{"prefix with a quote", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: `ve"th`}},
			ErrInvalidName, "detectLocal.interfaceNamePrefix", ""},
		{"bridge name dot", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: ".."}},
			ErrInvalidName, "detectLocal.bridgeInterface", ""},
		{"a bridge with the default mode", NodeConfig{DetectLocal: DetectLocal{BridgeInterface: "cbr0"}},
			ErrInvalidNode, "detectLocal.bridgeInterface", "set with mode ClusterCIDR, used only with mode BridgeInterface"},
		{"a prefix with mode BridgeInterface", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0", InterfaceNamePrefix: "veth"}},
			ErrInvalidNode, "detectLocal.interfaceNamePrefix", "used only with mode InterfaceNamePrefix"},
		{"node CIDRs with mode InterfaceNamePrefix", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth", NodeCIDRs: []netip.Prefix{nodeCIDR4}}},
			ErrInvalidNode, "detectLocal.nodeCIDRs", "used only with mode NodeCIDR"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateNode(&tt.node)
			checkValidation(t, err, tt.kind, "", tt.field, tt.substr)
			assert.Contains(t, err.Error(), "node config: ")
			_, err = NewState(tt.node)
			require.ErrorIs(t, err, tt.kind, "NewState")
			b, err := NewBuilder(NodeConfig{})
			require.NoError(t, err)
			require.ErrorIs(t, b.SetNode(tt.node), tt.kind, "SetNode")
		})
	}
}

// TestLocalMatch: each mode resolves, per family, to the rule backends
// render; the source modes detect only the families they have CIDRs of,
// the interface modes both.
func TestLocalMatch(t *testing.T) {
	for _, tt := range []struct {
		name       string
		node       NodeConfig
		mode       LocalMode
		want4      LocalMatch
		want6      LocalMatch
		detects4   bool
		detects6   bool
		jsonFields string
	}{
		{"nothing set", NodeConfig{}, LocalByClusterCIDR, LocalMatch{}, LocalMatch{}, false, false, `{}`},
		{"cluster CIDRs", NodeConfig{ClusterCIDRs: []netip.Prefix{cluster4, cluster6}}, LocalByClusterCIDR,
			LocalMatch{CIDRs: []netip.Prefix{cluster4}}, LocalMatch{CIDRs: []netip.Prefix{cluster6}}, true, true,
			`{"clusterCIDRs":["10.244.0.0/16","fd00:244::/32"]}`},
		{"node CIDR of one family", NodeConfig{ClusterCIDRs: []netip.Prefix{cluster4, cluster6},
			DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}}}, LocalByNodeCIDR,
			LocalMatch{CIDRs: []netip.Prefix{nodeCIDR4}}, LocalMatch{}, true, false,
			`{"clusterCIDRs":["10.244.0.0/16","fd00:244::/32"],"detectLocal":{"mode":"NodeCIDR","nodeCIDRs":["10.244.7.0/24"]}}`},
		{"bridge", NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"}}, LocalByBridgeInterface,
			LocalMatch{Interface: "cbr0"}, LocalMatch{Interface: "cbr0"}, true, true,
			`{"detectLocal":{"mode":"BridgeInterface","bridgeInterface":"cbr0"}}`},
		{"prefix", NodeConfig{ClusterCIDRs: []netip.Prefix{cluster4}, DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}},
			LocalByInterfaceNamePrefix, LocalMatch{Interface: "veth", Prefix: true}, LocalMatch{Interface: "veth", Prefix: true}, true, true,
			`{"clusterCIDRs":["10.244.0.0/16"],"detectLocal":{"mode":"InterfaceNamePrefix","interfaceNamePrefix":"veth"}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			require.NoError(t, ValidateNode(&tt.node))
			assert.Equal(t, tt.mode, tt.node.LocalMode())
			assert.Equal(t, tt.want4, tt.node.LocalMatch(IPv4))
			assert.Equal(t, tt.want6, tt.node.LocalMatch(IPv6))
			assert.Equal(t, tt.detects4, tt.node.DetectsLocal(IPv4))
			assert.Equal(t, tt.detects6, tt.node.DetectsLocal(IPv6))
			assert.Equal(t, tt.detects4, tt.node.LocalMatch(IPv4).Detects())
			raw, err := json.Marshal(tt.node)
			require.NoError(t, err)
			assert.JSONEq(t, tt.jsonFields, string(raw))
			var back NodeConfig
			require.NoError(t, json.Unmarshal(raw, &back))
			assert.Equal(t, tt.node.LocalMatch(IPv4), back.LocalMatch(IPv4))
		})
	}
}

// TestVerdictsFollowDetection: the verdicts depend on the detection only
// through whether it recognises pods in the family: a mode that does
// tells pods apart (unmasqueraded to the cluster IP, short-circuited to
// the cluster set under the external Local policy) and masquerades
// traffic from outside to the cluster IP; one that does not leaves pods
// with the outside's verdicts.
func TestVerdictsFollowDetection(t *testing.T) {
	detecting := "outside=cluster+masq pod=cluster node=cluster+masq"
	blind := "outside=cluster pod=cluster node=cluster"
	for _, tt := range []struct {
		name     string
		detect   DetectLocal
		family   Family
		internal string
		external string
	}{
		{"node CIDR", DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}}, IPv4,
			detecting, "outside=drop pod=cluster node=cluster+masq"},
		{"node CIDR of the other family", DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}}, IPv6,
			blind, "outside=drop pod=drop node=cluster+masq"},
		{"bridge, IPv4", DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"}, IPv4,
			detecting, "outside=drop pod=cluster node=cluster+masq"},
		{"bridge, IPv6", DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"}, IPv6,
			detecting, "outside=drop pod=cluster node=cluster+masq"},
		{"prefix, IPv6", DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}, IPv6,
			detecting, "outside=drop pod=cluster node=cluster+masq"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// No cluster CIDRs: whatever detects pods here is the mode's.
			node := NodeConfig{NodeName: "n1", NodeIPs: []netip.Addr{a("192.0.2.1"), a("2001:db8::1")}, DetectLocal: tt.detect}
			s := Service{
				Name: "ns/svc", ClusterIPs: []netip.Addr{a("10.96.0.1"), a("fd00:96::1")},
				Ports:                 []Port{{Name: "p", Protocol: TCP, Port: 80, NodePort: 30000}},
				ExternalTrafficPolicy: PolicyLocal,
				Endpoints:             []Endpoint{ep("10.0.1.1", "n2", "rs"), ep("fd00::1:1", "n2", "rs")},
			}
			st, err := NewState(node, s)
			require.NoError(t, err)
			sp := st.Port(ServicePortKey{Service: "ns/svc", Port: "p", Family: tt.family})
			require.NotNil(t, sp)
			assert.Equal(t, tt.internal, sp.Internal.String(), "internal verdicts")
			assert.Equal(t, tt.external, sp.External.String(), "external verdicts")
		})
	}
}

// TestDiffSeesDetectionChanges: any change of the detection (its mode or
// its parameter) is a node change, so that backends rewrite the rules
// that recognise pods, even when no verdict changes.
func TestDiffSeesDetectionChanges(t *testing.T) {
	base := NodeConfig{NodeName: "n1", ClusterCIDRs: []netip.Prefix{cluster4}}
	steps := []DetectLocal{
		{Mode: LocalByClusterCIDR},
		{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}},
		{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.8.0/24")}},
		{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"},
		{Mode: LocalByBridgeInterface, BridgeInterface: "cbr1"},
		{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "cbr1"},
		{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
		{},
	}
	n := base
	b, err := NewBuilder(n)
	require.NoError(t, err)
	require.NoError(t, b.Upsert(simple("a", "10.96.0.1", "10.244.1.1")))
	prev := b.State()
	for _, d := range steps {
		n.DetectLocal = d
		require.NoError(t, b.SetNode(n), "%+v", d)
		cur := b.State()
		c := Diff(prev, cur)
		assert.True(t, c.NodeChanged, "detection %+v after %+v: no node change", d, prev.Node().DetectLocal)
		assert.Empty(t, c.Changed, "no verdict changes within IPv4 detection")
		assert.Equal(t, d, cur.Node().DetectLocal)
		prev = cur
	}
	last := Diff(prev, b.State())
	assert.True(t, last.Empty())
}

// TestDetectLocalIsCopied: a State keeps its own copy of the node CIDRs.
func TestDetectLocalIsCopied(t *testing.T) {
	cidrs := []netip.Prefix{nodeCIDR4}
	st, err := NewState(NodeConfig{DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: cidrs}})
	require.NoError(t, err)
	cidrs[0] = nodeCIDR6
	n := st.Node()
	assert.Equal(t, []netip.Prefix{nodeCIDR4}, n.DetectLocal.NodeCIDRs)
}

// TestCheckNode: a backend without FeatureLocalByInterface refuses the
// interface modes with ErrUnsupported, at Require (so at NewRunner) and
// at SetNode, and accepts the source modes.
func TestCheckNode(t *testing.T) {
	narrow := Capabilities{Backend: "narrow", Features: AllFeatures &^ FeatureLocalByInterface}
	wide := Capabilities{Backend: "wide", Features: AllFeatures}
	bridge := NodeConfig{DetectLocal: DetectLocal{Mode: LocalByBridgeInterface, BridgeInterface: "cbr0"}}
	prefix := NodeConfig{DetectLocal: DetectLocal{Mode: LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"}}
	nodeCIDR := NodeConfig{DetectLocal: DetectLocal{Mode: LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{nodeCIDR4}}}
	for _, n := range []NodeConfig{bridge, prefix} {
		err := narrow.CheckNode(&n)
		checkValidation(t, err, ErrUnsupported, "", "detectLocal.mode", "the narrow backend cannot tell pods by interface")
		assert.NoError(t, wide.CheckNode(&n))
		b, err := NewBuilder(n)
		require.NoError(t, err)
		require.ErrorIs(t, b.Require(narrow), ErrUnsupported)
		require.NoError(t, b.Require(wide))
	}
	for _, n := range []NodeConfig{{}, nodeCIDR} {
		assert.NoError(t, narrow.CheckNode(&n))
	}
	b, err := NewBuilder(nodeCIDR)
	require.NoError(t, err)
	require.NoError(t, b.Require(narrow))
	err = b.SetNode(bridge)
	require.ErrorIs(t, err, ErrUnsupported)
	var ve *ValidationError
	require.True(t, errors.As(err, &ve))
	assert.Equal(t, nodeCIDR.DetectLocal, b.State().Node().DetectLocal, "a refused SetNode changed the node")
	assert.Contains(t, AllFeatures.String(), "local-by-interface")
}

// TestPodsByNamespace: only the cluster-CIDR mode (the default) calls
// every flow from a pod's namespace a pod's.
func TestPodsByNamespace(t *testing.T) {
	for mode, want := range map[LocalMode]bool{"": true, LocalByClusterCIDR: true, LocalByNodeCIDR: false,
		LocalByBridgeInterface: false, LocalByInterfaceNamePrefix: false} {
		n := NodeConfig{DetectLocal: DetectLocal{Mode: mode}}
		assert.Equal(t, want, n.PodsByNamespace(), "mode %q", mode)
	}
}
