package kubesource

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeCIDRs returns the pod CIDRs the cluster allocated to the named node
// (its spec.podCIDRs, or spec.podCIDR on a node without them): the
// prefixes of kube-proxy's --detect-local-mode=NodeCIDR. It needs get on
// the Node.
func NodeCIDRs(ctx context.Context, c kubernetes.Interface, node string) ([]netip.Prefix, error) {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node: %w", err)
	}
	return podCIDRs(n)
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
