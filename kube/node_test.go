package kubesource

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestNodeCIDRs: a Node's spec.podCIDRs (else spec.podCIDR) are its pod
// CIDRs; a node without any, a malformed one or a missing node is an
// error.
func TestNodeCIDRs(t *testing.T) {
	node := func(name, single string, cidrs ...string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: single, PodCIDRs: cidrs}}
	}
	c := fake.NewClientset(
		node("dual", "10.244.1.0/24", "10.244.1.0/24", "fd00:244:1::/64"),
		node("old", "10.244.2.0/24"),
		node("none", ""),
		node("bad", "", "10.244.3.0/33"),
	)
	ctx := context.Background()
	got, err := NodeCIDRs(ctx, c, "dual")
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}, got)
	got, err = NodeCIDRs(ctx, c, "old")
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}, got)
	for name, want := range map[string]string{"none": "no spec.podCIDRs", "bad": "spec.podCIDRs", "missing": "node missing not found"} {
		_, err := NodeCIDRs(ctx, c, name)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), want, name)
	}
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
