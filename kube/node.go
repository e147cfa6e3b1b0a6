package kube

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilnet "k8s.io/utils/net"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to remove: kube-proxy's node is not eligible for traffic once
// it has it.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Node is what a proxy reads of its own Node object.
type Node struct {
	// Name is the Node's name.
	Name string
	// IPs are the node's primary addresses, one per family at most, IPv4
	// first: the first InternalIP of each family, else its first
	// ExternalIP, as kube-proxy takes them (and as kubelet reports the
	// address it was given with --node-ip first).
	IPs []netip.Addr
	// PodCIDRs are the pod CIDRs the cluster allocated to the node
	// (spec.podCIDRs, or spec.podCIDR): kube-proxy's local traffic under
	// detectLocalMode NodeCIDR. None until the node controller allocates
	// them.
	PodCIDRs []netip.Prefix
	// Zone is the node's topology zone (label topology.kubernetes.io/zone),
	// which topology hints name.
	Zone string
	// Ineligible says why the node may not take traffic, as kube-proxy's
	// /healthz judges it (see Ineligible), or "" when it may.
	Ineligible string
}

// NodeOf reads a Node object; nil reads as a node that is not there.
func NodeOf(n *corev1.Node) Node {
	if n == nil {
		return Node{Ineligible: Ineligible(nil)}
	}
	out := Node{Name: n.Name, IPs: nodeIPs(n), PodCIDRs: podCIDRs(n), Zone: n.Labels[LabelZone], Ineligible: Ineligible(n)}
	return out
}

// Equal reports whether two readings of a node are the same.
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && slices.Equal(n.IPs, o.IPs) && slices.Equal(n.PodCIDRs, o.PodCIDRs) &&
		n.Zone == o.Zone && n.Ineligible == o.Ineligible
}

// nodeIPs returns the node's primary address per family.
func nodeIPs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, f := range servicelb.Families() {
		for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
			a, ok := firstAddr(n.Status.Addresses, typ, f)
			if ok {
				out = append(out, a)
				break
			}
		}
	}
	return out
}

func firstAddr(addrs []corev1.NodeAddress, typ corev1.NodeAddressType, f servicelb.Family) (netip.Addr, bool) {
	for _, na := range addrs {
		if na.Type != typ {
			continue
		}
		if a, ok := parseAddr(na.Address); ok && servicelb.FamilyOf(a) == f {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// podCIDRs reads a Node's pod CIDRs; a CIDR that does not parse is left
// out.
func podCIDRs(n *corev1.Node) []netip.Prefix {
	texts := n.Spec.PodCIDRs
	if len(texts) == 0 && n.Spec.PodCIDR != "" {
		texts = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, t := range texts {
		_, c, err := utilnet.ParseCIDRSloppy(strings.TrimSpace(t))
		if err != nil {
			continue
		}
		a, ok := netip.AddrFromSlice(c.IP)
		if !ok {
			continue
		}
		ones, _ := c.Mask.Size()
		out = append(out, netip.PrefixFrom(a.Unmap(), ones).Masked())
	}
	return out
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

// nodeSelector selects the named node alone, as kube-proxy lists and
// watches its own Node.
func nodeSelector(node string) string {
	return fields.OneTermEqualSelector("metadata.name", node).String()
}

// NodeName returns the name a proxy knows its node by, as kube-proxy
// makes it of --hostname-override (or the hostname): without surrounding
// spaces, in lower case.
func NodeName(name string) string { return strings.ToLower(strings.TrimSpace(name)) }
