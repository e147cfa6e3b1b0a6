package kubesource

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to remove: kube-proxy's node is not eligible for traffic once
// it has it.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// nodeSelector selects the named node alone, as kube-proxy lists and
// watches its own Node.
func nodeSelector(node string) string {
	return fields.OneTermEqualSelector("metadata.name", node).String()
}

// NodeCIDRs returns the pod CIDRs the cluster allocated to the named node
// (its spec.podCIDRs, or spec.podCIDR on a node without them): the
// prefixes of kube-proxy's --detect-local-mode=NodeCIDR. It lists the
// Node by name, as the Source watches it: it needs list on nodes.
func NodeCIDRs(ctx context.Context, c kubernetes.Interface, node string) ([]netip.Prefix, error) {
	l, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: nodeSelector(node)})
	if err != nil {
		return nil, fmt.Errorf("list node %s: %w", node, err)
	}
	for i := range l.Items {
		if l.Items[i].Name == node {
			return podCIDRs(&l.Items[i])
		}
	}
	return nil, fmt.Errorf("node %s not found", node)
}

// podCIDRs parses a Node's pod CIDRs.
func podCIDRs(n *corev1.Node) ([]netip.Prefix, error) {
	texts := n.Spec.PodCIDRs
	if len(texts) == 0 && n.Spec.PodCIDR != "" {
		texts = []string{n.Spec.PodCIDR}
	}
	if len(texts) == 0 {
		return nil, errors.New("the node has no spec.podCIDRs (none allocated yet?)")
	}
	out := make([]netip.Prefix, 0, len(texts))
	for _, t := range texts {
		p, err := netip.ParsePrefix(t)
		if err != nil {
			return nil, fmt.Errorf("spec.podCIDRs: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Ineligible says why a node may not take traffic, as kube-proxy's
// /healthz judges it, or "" when it may: a node not found, one being
// deleted (its deletionTimestamp set) or one tainted
// ToBeDeletedByClusterAutoscaler, whatever the taint's effect, is not
// eligible.
func Ineligible(n *corev1.Node) string {
	switch {
	case n == nil:
		return "no Node object of this name"
	case n.DeletionTimestamp != nil:
		return "the Node is being deleted"
	}
	for _, t := range n.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return "the Node is tainted " + ToBeDeletedTaint
		}
	}
	return ""
}
