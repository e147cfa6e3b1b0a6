package servicelb

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Flow is a new flow whose fate State.Explain tells: where it comes from
// and where it is sent.
type Flow struct {
	// Protocol is TCP, UDP or SCTP; "" is TCP.
	Protocol Protocol
	// Src is the flow's source; its port may be 0.
	Src netip.AddrPort
	// Dst is the address and port the flow is sent to.
	Dst netip.AddrPort
	// Origin, when set, is where the flow comes from; nil lets Explain
	// tell it as the node does (Explanation.OriginWhy says how).
	Origin *Origin
	// InInterface is the interface the flow comes in on, for a node that
	// tells its pods' flows by interface (DetectLocal's interface modes);
	// empty for a flow the node sends.
	InInterface string
}

// Explanation is what a State decides for one new flow, and why: the
// frontend it hits, the verdict and its reasons, the endpoints it may go
// to with their weights, and each endpoint left out with its reason. It
// is read from the State's service ports and node config, which are all
// a backend reads, so it cannot disagree with what a backend programs.
type Explanation struct {
	Flow Flow
	// Origin is where the flow comes from, OriginWhy how that was told.
	Origin    Origin
	OriginWhy string
	// Handled is false for a flow the proxy leaves alone: no frontend of
	// a service and no address it answers for; the node routes it as any
	// other.
	Handled bool
	// Port is the service port whose Frontend the flow hits; nil when it
	// hits none (then Why says what becomes of it).
	Port     *ServicePort
	Frontend Frontend
	// Verdict is what happens to the flow: forwarded to the cluster's
	// endpoints or this node's, masqueraded or not, rejected or dropped.
	Verdict Verdict
	// Why gives the reasons for the verdict, in the order they apply.
	Why []string
	// MasqueradeWhy says why the flow is masqueraded or keeps its source.
	MasqueradeWhy string
	// SourceRanges are the sources a load-balancer IP admits (empty: all),
	// and SourceAllowed whether the flow's is one of them.
	SourceRanges  []netip.Prefix
	SourceAllowed bool
	// Affinity is the port's client affinity timeout; zero for none.
	Affinity time.Duration
	// Endpoints are those the flow may go to, with their weights.
	Endpoints []Backend
	// Excluded are the port's other endpoints, each with its reason.
	Excluded []Excluded
	// Conflicts are the clashes over the flow's frontend: services that
	// claim it and are not served on it.
	Conflicts []Conflict
}

// Excluded is an endpoint of a service that a flow does not go to.
type Excluded struct {
	// Endpoint is the endpoint's address and its port for the service
	// port (0 when it serves none).
	Endpoint netip.AddrPort
	// NodeName is the node it runs on.
	NodeName string
	// Why says why the flow does not go there.
	Why string
}

// Explain tells what the state decides for a new flow f, and why (see
// Explanation). It changes nothing.
func (s *State) Explain(f Flow) Explanation {
	if f.Protocol == "" {
		f.Protocol = TCP
	}
	e := Explanation{Flow: f, SourceAllowed: true}
	e.Origin, e.OriginWhy = s.originOf(f)
	e.Conflicts = s.conflictsAt(f)
	sp, fe, ok := s.frontendAt(f.Protocol, f.Dst)
	if !ok || (f.Dst.Addr().IsLoopback() && e.Origin != FromNode) {
		s.miss(&e)
		return e
	}
	e.Handled, e.Port, e.Frontend, e.Affinity = true, sp, fe, sp.Affinity
	svc, _ := s.Service(sp.Key.Service)
	e.Verdict = sp.Verdicts(fe.Kind).Of(e.Origin)
	e.Why = append(e.Why, fmt.Sprintf("%s is the %s of %s", f.Dst, fe.Kind, sp.Key))
	// A port with no endpoint anywhere rejects every source: the ranges
	// guard the endpoints, as kube-proxy's firewall chain exists only
	// for a service with endpoints.
	if fe.Kind == LoadBalancerFrontend && len(sp.SourceRanges) > 0 && e.Verdict.Action != Reject {
		e.SourceRanges = sp.SourceRanges
		if !prefixesContain(sp.SourceRanges, f.Src.Addr()) {
			e.SourceAllowed = false
			e.Verdict = Verdict{Action: Drop}
			e.Why = append(e.Why, fmt.Sprintf("source %s is outside the service's source ranges %v: dropped "+
				"before any endpoint is chosen", f.Src.Addr(), sp.SourceRanges))
			return e
		}
	}
	e.Why = append(e.Why, s.verdictWhy(svc, sp, fe.Kind, e.Origin, e.Verdict.Action))
	if e.Verdict.Action.Forwards() {
		e.MasqueradeWhy = s.masqueradeWhy(svc, sp, fe.Kind, e.Origin)
		e.Endpoints = slices.Clone(sp.Targets(e.Verdict))
		if sp.IsHairpin(f.Src.Addr()) {
			e.MasqueradeWhy += "; a flow from an endpoint that reaches itself is masqueraded (hairpin)"
		}
	}
	set := e.Verdict.Action
	if set == Drop {
		set = ToLocal // the only forwarding that drops: a Local policy without a local endpoint
	}
	e.Excluded = s.excluded(svc, sp, e.Endpoints, set)
	return e
}

// originOf tells where a flow comes from, as the node's local-traffic
// detection and its addresses tell it.
func (s *State) originOf(f Flow) (Origin, string) {
	if f.Origin != nil {
		return *f.Origin, "given"
	}
	src := f.Src.Addr()
	m := s.node.LocalMatch(FamilyOf(src))
	switch {
	case len(m.CIDRs) > 0 && prefixesContain(m.CIDRs, src):
		return FromPod, fmt.Sprintf("source %s is in the pods' CIDRs %v (detect-local mode %s)", src, m.CIDRs, s.node.LocalMode())
	case m.Interface != "" && f.InInterface != "" && interfaceMatches(m, f.InInterface):
		return FromPod, fmt.Sprintf("it comes in on %s, the pods' interface (detect-local mode %s)", f.InInterface, s.node.LocalMode())
	case src.IsLoopback() || slices.Contains(s.node.NodeIPs, src) || slices.Contains(s.node.LocalIPs, src):
		return FromNode, fmt.Sprintf("source %s is an address of the node", src)
	}
	return FromOutside, fmt.Sprintf("source %s is neither a pod's of this node (detect-local mode %s) nor the node's", src, s.node.LocalMode())
}

// interfaceMatches reports whether a flow that came in on the interface
// named name is a pod's under m.
func interfaceMatches(m LocalMatch, name string) bool {
	if m.Prefix {
		return len(name) >= len(m.Interface) && name[:len(m.Interface)] == m.Interface
	}
	return name == m.Interface
}

// frontendAt returns the service port that serves the frontend dst with
// protocol p, and the frontend.
func (s *State) frontendAt(p Protocol, dst netip.AddrPort) (*ServicePort, Frontend, bool) {
	f := FamilyOf(dst.Addr())
	for _, sp := range s.Ports() {
		if sp.Family != f || sp.Port.Protocol != p {
			continue
		}
		for _, fe := range sp.Frontends() {
			if fe.AddrPort() == dst {
				return sp, fe, true
			}
		}
	}
	return nil, Frontend{}, false
}

// conflictsAt returns the conflicts over the flow's destination: as an
// address and port, and as a node port.
func (s *State) conflictsAt(f Flow) []Conflict {
	at := frontKey{f.Dst.Addr(), f.Protocol, f.Dst.Port()}.String()
	np := fmt.Sprintf("node port %d/%s", f.Dst.Port(), f.Protocol)
	var out []Conflict
	for _, c := range s.conflicts {
		if c.Frontend == at || c.Frontend == np {
			out = append(out, c)
		}
	}
	return out
}

// miss explains a flow that hits no frontend.
func (s *State) miss(e *Explanation) {
	f := e.Flow
	dst := f.Dst.Addr()
	if dst.IsLoopback() && e.Origin != FromNode {
		e.Why = append(e.Why, fmt.Sprintf("%s is the sender's own loopback: the node is not involved", dst))
		return
	}
	for _, sp := range s.Ports() {
		if sp.ClusterIP == dst {
			e.Handled = true
			e.Verdict = Verdict{Action: Reject}
			e.Why = append(e.Why, fmt.Sprintf("%s is the cluster IP of %s, which has no port %d/%s: rejected",
				dst, sp.Key.Service, f.Dst.Port(), f.Protocol))
			return
		}
	}
	if cidrs := s.node.DroppedServiceCIDRs(FamilyOf(dst)); prefixesContain(cidrs, dst) {
		e.Handled = true
		e.Verdict = Verdict{Action: Drop}
		e.Why = append(e.Why, fmt.Sprintf("%s is in the service CIDRs %v but is no service's cluster IP "+
			"(an unallocated service address): dropped", dst, cidrs))
		return
	}
	for _, sp := range s.Ports() {
		if slices.Contains(sp.ExternalIPs, dst) || slices.Contains(sp.LoadBalancerIPs, dst) ||
			(sp.Port.NodePort == f.Dst.Port() && sp.Port.Protocol == f.Protocol && sp.Family == FamilyOf(dst)) {
			e.Why = append(e.Why, fmt.Sprintf("%s is no frontend of %s (whose frontends are %v): the proxy leaves the flow alone",
				f.Dst, sp.Key, sp.Frontends()))
			return
		}
	}
	e.Why = append(e.Why, fmt.Sprintf("%s/%s is no service's frontend: the proxy leaves the flow alone", f.Dst, f.Protocol))
}

// policyOf returns the traffic policy that rules frontends of kind k.
func policyOf(svc *Service, k FrontendKind) (string, TrafficPolicy) {
	if k == ClusterIPFrontend {
		return "internal", cmpPolicy(svc.InternalTrafficPolicy)
	}
	return "external", cmpPolicy(svc.ExternalTrafficPolicy)
}

func cmpPolicy(p TrafficPolicy) TrafficPolicy {
	if p == PolicyLocal {
		return PolicyLocal
	}
	return PolicyCluster
}

// verdictWhy says why the port's verdict for a flow from o to a frontend
// of kind k takes action a, as ServicePort.decide decides it.
func (s *State) verdictWhy(svc *Service, sp *ServicePort, k FrontendKind, o Origin, a Action) string {
	which, policy := policyOf(svc, k)
	switch a {
	case Reject:
		return fmt.Sprintf("no endpoint of %s serves the port anywhere (none ready, none serving while terminating): rejected", sp.Key)
	case Drop:
		return fmt.Sprintf("the %s traffic policy is Local and no endpoint of this node (%q) serves the port; "+
			"another node may: dropped", which, s.node.NodeName)
	case ToLocal:
		return fmt.Sprintf("the %s traffic policy is Local: this node's endpoints only", which)
	}
	if k.External() && policy == PolicyLocal {
		if o == FromPod {
			return "from a pod of this node, traffic to an external frontend of a Local policy goes to every endpoint, " +
				"as the cluster IP's would (kube-proxy's short-circuit)"
		}
		return "from the node, traffic to an external frontend of a Local policy goes to every endpoint, " +
			"as if it had gone out to the load balancer and come back"
	}
	return fmt.Sprintf("the %s traffic policy is Cluster: every endpoint that serves the port", which)
}

// masqueradeWhy says why a forwarded flow is masqueraded or keeps its
// source, as ServicePort.decide decides it.
func (s *State) masqueradeWhy(svc *Service, sp *ServicePort, k FrontendKind, o Origin) string {
	_, policy := policyOf(svc, k)
	detects := s.node.DetectsLocal(sp.Family)
	switch {
	case k == ClusterIPFrontend && s.node.MasqueradeAll:
		return "every flow to a cluster IP is masqueraded (MasqueradeAll)"
	case k == ClusterIPFrontend && o == FromPod:
		return "a pod's flow to a cluster IP keeps its source"
	case k == ClusterIPFrontend && detects:
		return fmt.Sprintf("a flow to a cluster IP from the %s is masqueraded, so that the endpoint's reply comes back through this node", o)
	case k == ClusterIPFrontend:
		return fmt.Sprintf("the node tells no pod's flows apart in %s (no local-traffic detection), so flows to cluster IPs keep their source", sp.Family)
	case policy == PolicyCluster:
		return "external traffic under the Cluster policy is masqueraded: the endpoint may be on another node"
	case o == FromNode:
		return "the node's flow to an external frontend of a Local policy is masqueraded"
	}
	return "the Local policy keeps the client's source"
}

// excluded lists the endpoints of the port's family that the flow does
// not go to (chosen are those it may go to), each with its reason, as
// the selection of set (ToCluster or ToLocal) leaves them out.
func (s *State) excluded(svc *Service, sp *ServicePort, chosen []Backend, set Action) []Excluded {
	node := &s.node
	cs := candidates(node, svc, sp.Port, sp.Family)
	_, scope := selectCluster(node, cs)
	byAddr := map[netip.AddrPort]*candidate{}
	for i := range cs {
		byAddr[cs[i].AddrPort()] = &cs[i]
	}
	readyIn := false // a ready endpoint takes this traffic: terminating ones are not used
	for _, b := range chosen {
		readyIn = readyIn || b.Ready
	}
	var out []Excluded
	for i := range svc.Endpoints {
		ep := &svc.Endpoints[i]
		if FamilyOf(ep.Addr) != sp.Family {
			continue
		}
		port, serves := endpointPort(ep, sp.Port)
		ap := netip.AddrPortFrom(ep.Addr, port)
		if serves && slices.ContainsFunc(chosen, func(b Backend) bool { return b.AddrPort() == ap }) {
			continue
		}
		x := Excluded{Endpoint: ap, NodeName: ep.NodeName}
		c := byAddr[ap]
		switch {
		case !serves:
			x.Endpoint = netip.AddrPortFrom(ep.Addr, 0)
			x.Why = fmt.Sprintf("it serves no port named %q", sp.Port.Name)
		case ep.EffectiveWeight() == 0:
			x.Why = "weight 0: drained, it takes no new flows"
		case c == nil || c.ep != ep:
			x.Why = "another endpoint is listed with the same address and port, and stands for it"
		case !c.serving && ep.Terminating:
			x.Why = "terminating, and no longer serving"
		case !c.serving:
			x.Why = "not ready"
		case set == ToLocal && !c.Local:
			x.Why = fmt.Sprintf("on node %q, not this node (%q): the Local policy takes this node's endpoints only", ep.NodeName, node.NodeName)
		case !c.Ready && readyIn:
			x.Why = "terminating: ready endpoints take this traffic, and terminating ones serve only when none is ready"
		case set == ToCluster && scope == hintsNode:
			x.Why = fmt.Sprintf("its topology hints are for nodes %v, not this node (%q)", ep.Hints.ForNodes, node.NodeName)
		case set == ToCluster && scope == hintsZone:
			x.Why = fmt.Sprintf("its topology hints are for zones %v, not this node's zone (%q)", ep.Hints.ForZones, node.Zone)
		case set != ToCluster && set != ToLocal:
			x.Why = "the flow is not forwarded"
		default:
			x.Why = "not selected"
		}
		out = append(out, x)
	}
	return out
}
