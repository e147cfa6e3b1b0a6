package kube

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeOf: a Node's primary address per family (an InternalIP, else
// an ExternalIP, IPv4 first), its pod CIDRs (spec.podCIDRs, else
// spec.podCIDR), its zone and its eligibility, as kube-proxy reads them.
func TestNodeOf(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{LabelZone: "zone-a"}},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n1"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.1"},
			{Type: corev1.NodeInternalIP, Address: "fd00::11"},
			{Type: corev1.NodeInternalIP, Address: "10.0.0.011"},
			{Type: corev1.NodeInternalIP, Address: "10.0.0.12"},
		}},
	}
	got := NodeOf(n)
	assert.Equal(t, Node{
		Name: "n1", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00::11")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")},
		Zone:     "zone-a",
	}, got)

	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeExternalIP, Address: "203.0.113.1"}}
	n.Spec.PodCIDRs = nil
	got = NodeOf(n)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.1")}, got.IPs, "no InternalIP: the ExternalIP")
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, got.PodCIDRs, "spec.podCIDR when podCIDRs are missing")
	assert.True(t, got.Equal(NodeOf(n)))

	n.Spec.PodCIDR = ""
	assert.Empty(t, NodeOf(n).PodCIDRs, "none allocated yet")
	assert.Equal(t, "no Node object of this name", NodeOf(nil).Ineligible)
}

// TestIneligible: a node may take traffic unless it is not found, being
// deleted, or tainted ToBeDeletedByClusterAutoscaler (whatever the
// effect), as kube-proxy's /healthz judges it.
func TestIneligible(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		node *corev1.Node
		want string
	}{
		{"a node", &corev1.Node{}, ""},
		{"other taints", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}, ""},
		{"not found", nil, "no Node object"},
		{"being deleted", &corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, "being deleted"},
		{"tainted by the autoscaler", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: "other", Effect: corev1.TaintEffectNoSchedule},
			{Key: ToBeDeletedTaint, Value: "1700000000", Effect: corev1.TaintEffectNoSchedule}}}}, "tainted ToBeDeletedByClusterAutoscaler"},
		{"tainted PreferNoSchedule", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{
			{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectPreferNoSchedule}}}}, "tainted"},
	} {
		got := Ineligible(tc.node)
		if tc.want == "" {
			assert.Empty(t, got, tc.name)
		} else {
			assert.Contains(t, got, tc.want, tc.name)
		}
	}
}

// TestNodeName: the node's name as kube-proxy makes it of
// --hostname-override or the hostname.
func TestNodeName(t *testing.T) {
	assert.Equal(t, "node-a", NodeName("  Node-A\n"))
}
