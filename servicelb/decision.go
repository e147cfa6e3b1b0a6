package servicelb

import "fmt"

// Origin is where a new flow to a service comes from, as a node proxy tells
// origins apart. A flow is FromPod when the node's local-traffic detection
// claims it (NodeConfig.LocalMatch: its source, or the interface it came in
// on), else FromNode when a process of the node sent it, else FromOutside.
type Origin uint8

// The origins of traffic, in the order a backend tests them.
const (
	// FromOutside is a client outside the cluster, or any client the
	// node cannot tell apart from one.
	FromOutside Origin = iota
	// FromPod is a pod of this node, as the node's local-traffic
	// detection sees it (NodeConfig.DetectLocal): by default a source in
	// the cluster CIDRs of the flow's family.
	FromPod
	// FromNode is a process of the node itself.
	FromNode
	numOrigins
)

// Origins returns every origin, in order.
func Origins() []Origin { return []Origin{FromOutside, FromPod, FromNode} }

// String returns "outside", "pod" or "node".
func (o Origin) String() string {
	switch o {
	case FromOutside:
		return "outside"
	case FromPod:
		return "pod"
	case FromNode:
		return "node"
	}
	return fmt.Sprintf("origin(%d)", uint8(o))
}

// Action is what happens to a new flow to a service port.
type Action uint8

// The actions. Reject is the zero value: a port that nothing serves
// refuses its traffic.
const (
	// Reject refuses the flow at once: no endpoint serves the port
	// anywhere. The client gets an ICMP (or ICMPv6) port unreachable,
	// which a TCP client sees as a refused connection.
	Reject Action = iota
	// Drop discards the flow silently: endpoints exist, but none for
	// this traffic (a Local policy on a node without a local endpoint),
	// and another node may serve it.
	Drop
	// ToCluster forwards the flow to one of ServicePort.Cluster.
	ToCluster
	// ToLocal forwards the flow to one of ServicePort.Local.
	ToLocal
)

// String returns "reject", "drop", "cluster" or "local".
func (a Action) String() string {
	switch a {
	case Reject:
		return "reject"
	case Drop:
		return "drop"
	case ToCluster:
		return "cluster"
	case ToLocal:
		return "local"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// Forwards reports whether the action sends the flow to an endpoint.
func (a Action) Forwards() bool { return a == ToCluster || a == ToLocal }

// Verdict is the decision for the new flows of one origin to one kind of
// frontend.
type Verdict struct {
	Action Action
	// Masquerade rewrites the flow's source to the node's address on the
	// way to the endpoint, so that replies come back through this node.
	// It is false unless Action forwards.
	Masquerade bool
}

// String formats the verdict as "cluster+masq", "local", "drop", ...
func (v Verdict) String() string {
	if v.Masquerade {
		return v.Action.String() + "+masq"
	}
	return v.Action.String()
}

// Verdicts holds one Verdict per Origin.
type Verdicts [numOrigins]Verdict

// Of returns the verdict for origin o.
func (vs Verdicts) Of(o Origin) Verdict { return vs[o] }

// Uniform reports whether every origin gets the same verdict, and which.
func (vs Verdicts) Uniform() (Verdict, bool) {
	return vs[0], vs[0] == vs[1] && vs[0] == vs[2]
}

// String formats the verdicts as "outside=cluster pod=cluster node=cluster+masq".
func (vs Verdicts) String() string {
	return fmt.Sprintf("outside=%s pod=%s node=%s", vs[FromOutside], vs[FromPod], vs[FromNode])
}

// FrontendKind says how a frontend of a service port is reached.
type FrontendKind uint8

// The kinds of frontend.
const (
	// ClusterIPFrontend is the cluster IP and the port. Its traffic
	// follows the internal traffic policy.
	ClusterIPFrontend FrontendKind = iota
	// NodePortFrontend is a node address and the node port.
	NodePortFrontend
	// ExternalIPFrontend is an external IP and the port.
	ExternalIPFrontend
	// LoadBalancerFrontend is a load-balancer IP and the port; only
	// these are subject to source ranges.
	LoadBalancerFrontend
)

// String returns "cluster IP", "node port", "external IP" or
// "load-balancer IP".
func (k FrontendKind) String() string {
	switch k {
	case ClusterIPFrontend:
		return "cluster IP"
	case NodePortFrontend:
		return "node port"
	case ExternalIPFrontend:
		return "external IP"
	case LoadBalancerFrontend:
		return "load-balancer IP"
	}
	return fmt.Sprintf("frontend(%d)", uint8(k))
}

// External reports whether traffic to the frontend follows the external
// traffic policy.
func (k FrontendKind) External() bool { return k != ClusterIPFrontend }

// decide fills the port's verdicts from its endpoint sets, the service's
// policies and the node's local-traffic detection. It is the one place
// where kube-proxy's rules for reject, drop, masquerade and the Local
// policies' short-circuits are written down:
//
//   - A port no endpoint serves anywhere (both sets empty) rejects every
//     flow (kube-proxy: !hasAnyEndpoints, REJECT).
//   - Traffic to the cluster IP takes the set of the internal policy,
//     from every origin; with that set empty it is dropped. It is
//     masqueraded from outside and from the node when the node detects
//     local traffic in the family (NodeConfig.DetectsLocal), from every
//     origin with MasqueradeAll.
//   - External traffic under the Cluster policy takes the cluster set and
//     is masqueraded, from every origin.
//   - External traffic under the Local policy from outside takes the
//     local set with the client's address kept, and is dropped without a
//     local endpoint; from a pod it takes the cluster set unmasqueraded,
//     and from the node the cluster set masqueraded, as if it had gone out
//     to a load balancer and come back (kube-proxy's EXT chain). A pod is
//     told apart only when the node detects local traffic; otherwise its
//     flows count as from outside.
func (sp *ServicePort) decide(node *NodeConfig, s *Service) {
	hasAny := len(sp.Cluster) > 0 || len(sp.Local) > 0
	if !hasAny {
		sp.Internal, sp.External = Verdicts{}, Verdicts{}
		return
	}
	detects := node.DetectsLocal(sp.Family)
	forward := func(a Action) Action {
		if (a == ToCluster && len(sp.Cluster) == 0) || (a == ToLocal && len(sp.Local) == 0) {
			return Drop
		}
		return a
	}
	verdict := func(a Action, masq bool) Verdict {
		a = forward(a)
		return Verdict{Action: a, Masquerade: masq && a.Forwards()}
	}

	internal := ToCluster
	if s.InternalTrafficPolicy == PolicyLocal {
		internal = ToLocal
	}
	offCluster := detects || node.MasqueradeAll
	sp.Internal[FromOutside] = verdict(internal, offCluster)
	sp.Internal[FromPod] = verdict(internal, node.MasqueradeAll)
	sp.Internal[FromNode] = verdict(internal, offCluster)

	if s.ExternalTrafficPolicy != PolicyLocal || !sp.ExternallyAccessible() {
		v := verdict(ToCluster, true)
		sp.External = Verdicts{v, v, v}
		return
	}
	sp.External[FromOutside] = verdict(ToLocal, false)
	sp.External[FromPod] = verdict(ToCluster, false)
	if !detects {
		sp.External[FromPod] = sp.External[FromOutside]
	}
	sp.External[FromNode] = verdict(ToCluster, true)
}
