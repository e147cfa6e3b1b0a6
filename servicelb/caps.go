package servicelb

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Capabilities say what a backend can express. A Proxier declares its own;
// a Runner validates its node (CheckNode) and every service against them
// as it arrives, and a backend checks the node and every service port it
// plans with CheckNode and CheckPort, so that a node or service a backend
// cannot serve is refused before the kernel, with the same error whatever
// the backend: a *ValidationError wrapping ErrUnsupported or ErrCapacity.
type Capabilities struct {
	// Backend names the backend in errors, such as "nftables".
	Backend string
	// Schedulers lists the scheduler hints the backend honours besides
	// SchedulerDefault, which every backend accepts.
	Schedulers []Scheduler
	// Protocols lists the protocols the backend carries; nil means TCP,
	// UDP and SCTP.
	Protocols []Protocol
	// MaxEndpoints bounds the endpoints of one service port's Cluster or
	// Local set; zero means no bound.
	MaxEndpoints int
	// Features are the parts of the semantics the backend implements.
	Features Features
	// Families lists the address families the backend programs, IPv4
	// first; nil means both. The service ports of another family are not
	// programmed. A Runner reports its syncs and its health by these
	// families (SyncResult.Families, Health.Families), as kube-proxy
	// reports those of its proxier of each family.
	Families []Family
}

// AddressFamilies returns the families the backend programs: Families,
// or both.
func (c *Capabilities) AddressFamilies() []Family {
	if len(c.Families) == 0 {
		return Families()
	}
	return c.Families
}

// Features is a set of semantic features a backend implements.
type Features uint32

// The features. A service that needs a security-relevant feature its
// backend lacks (source ranges) is refused; the others describe which
// scenarios of the conformance kit apply.
const (
	// FeatureSourceRanges: load-balancer source ranges are enforced.
	FeatureSourceRanges Features = 1 << iota
	// FeatureAffinity: ClientIP session affinity.
	FeatureAffinity
	// FeatureWeights: endpoint weights spread new flows in proportion.
	FeatureWeights
	// FeaturePreserveSource: forwarded flows that are not masqueraded
	// reach the endpoint with the client's own address. A backend
	// without it forwards every flow from the node's own address, as if
	// masqueraded (package userspace: the endpoint sees the proxy).
	FeaturePreserveSource
	// FeatureExternal: traffic that arrives from other hosts (node ports,
	// external and load-balancer IPs) is served.
	FeatureExternal
	// FeatureServiceCIDRs: traffic to an address of the service CIDRs
	// that no service port holds is dropped
	// (NodeConfig.DroppedServiceCIDRs).
	FeatureServiceCIDRs
	// FeatureAffinityExpiry: a pin ends when the affinity timeout passes
	// without a new flow from its client, whatever of the client's flows
	// the kernel still tracks. IPVS lacks it: it keeps a pin while
	// connections it chose are in its table, closed TCP connections
	// included until their TIME_WAIT ends (two minutes).
	FeatureAffinityExpiry
	// FeatureLocalhostNodePorts: node ports served on 127.0.0.1 to the
	// node's own clients (NodeConfig.LocalhostNodePorts).
	FeatureLocalhostNodePorts
	// FeatureLocalByInterface: the node's pods are told apart by the
	// interface their flows come in on (LocalByBridgeInterface,
	// LocalByInterfaceNamePrefix). A node that asks for it from a backend
	// without it is refused: its pods' flows would count as outside's.
	FeatureLocalByInterface
	// FeaturePacketVerdicts: verdicts act on a flow's first packet, as a
	// packet filter's do: a rejected TCP or SCTP flow gets an ICMP
	// (ICMPv6) port unreachable and a dropped one no answer at all. A
	// proxy that terminates connections (package userspace) lacks it:
	// the kernel resets a TCP connection (aborts an SCTP association) to
	// a port nothing listens on, and the proxy resets one it has accepted
	// but must not forward. UDP is rejected and dropped alike either way.
	FeaturePacketVerdicts
	// FeatureUndefinedPorts: traffic to a cluster IP (a ServicePort's
	// ClusterIP) on a port no service port of it has is rejected. A
	// packet filter rejects it by rule; a proxy that holds the cluster IPs
	// as the node's own addresses has the kernel refuse it, as at any
	// closed port.
	FeatureUndefinedPorts
	// FeatureFreePorts: serving a frontend takes none of the node's
	// ports: a process of the node binds any port on the wildcard address
	// (0.0.0.0, ::), as a host-network server does. A proxy that listens
	// on its frontends (package userspace) lacks it: while a frontend
	// listens on a port, binding the wildcard address on that port fails
	// with EADDRINUSE (binding one of the node's own addresses does not),
	// and a frontend whose port a process bound first is left out.
	FeatureFreePorts
	// FeatureLingeringFlows: a UDP or SCTP flow whose frontend no endpoint
	// serves any more, or that went away, runs on to the endpoint it
	// reached until it idles out, as a conntrack translation does (see
	// StaleFlow). A proxy whose listener goes with the port's last
	// serving endpoint (package userspace) lacks it, and so do socket
	// hooks, which translate each new socket afresh (package ebpf), and
	// IPVS, which ends a connection whose server is gone at its next
	// packet (expire_nodest_conn, as kube-proxy's IPVS mode sets it).
	FeatureLingeringFlows
	// FeatureNoARPAnswers: the node claims no service address on its
	// links: it answers no ARP request for a cluster, external or
	// load-balancer IP, which a neighbour or a load-balancer announcer
	// (keepalived, MetalLB's L2 mode) may own. Packet filters never hold
	// those addresses. A backend that holds them on a link of the node
	// (package ipvs on its dummy link, package userspace with
	// HoldAddresses) has it only with its StrictARP option, which keeps
	// the node from answering ARP on one link for an address of another
	// (arp_ignore=1, arp_announce=2).
	FeatureNoARPAnswers

	// AllFeatures is every feature.
	AllFeatures = FeatureSourceRanges | FeatureAffinity | FeatureWeights | FeaturePreserveSource |
		FeatureExternal | FeatureServiceCIDRs | FeatureAffinityExpiry | FeatureLocalhostNodePorts |
		FeatureLocalByInterface | FeaturePacketVerdicts | FeatureUndefinedPorts | FeatureFreePorts |
		FeatureLingeringFlows | FeatureNoARPAnswers
)

// Has reports whether every feature of f is in fs.
func (fs Features) Has(f Features) bool { return fs&f == f }

var featureNames = []struct {
	f    Features
	name string
}{
	{FeatureSourceRanges, "source-ranges"}, {FeatureAffinity, "affinity"}, {FeatureWeights, "weights"},
	{FeaturePreserveSource, "preserve-source"}, {FeatureExternal, "external"}, {FeatureServiceCIDRs, "service-cidrs"},
	{FeatureAffinityExpiry, "affinity-expiry"}, {FeatureLocalhostNodePorts, "localhost-node-ports"},
	{FeatureLocalByInterface, "local-by-interface"}, {FeaturePacketVerdicts, "packet-verdicts"},
	{FeatureUndefinedPorts, "undefined-ports"}, {FeatureFreePorts, "free-ports"},
	{FeatureLingeringFlows, "lingering-flows"}, {FeatureNoARPAnswers, "no-arp-answers"},
}

// String lists the features by name, such as "affinity,weights".
func (fs Features) String() string {
	var names []string
	for _, n := range featureNames {
		if fs.Has(n.f) {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// AcceptsScheduler reports whether the backend honours hint s.
func (c *Capabilities) AcceptsScheduler(s Scheduler) bool {
	return s == SchedulerDefault || slices.Contains(c.Schedulers, s)
}

// AcceptsProtocol reports whether the backend carries protocol p.
func (c *Capabilities) AcceptsProtocol(p Protocol) bool {
	return c.Protocols == nil || slices.Contains(c.Protocols, p)
}

func (c *Capabilities) backend() string {
	if c.Backend == "" {
		return "the backend"
	}
	return "the " + c.Backend + " backend"
}

// CheckNode reports what in a valid node config the backend cannot
// express: nil, or *ValidationErrors wrapping ErrUnsupported. A node the
// backend refuses fails every sync: nothing of the state is applied.
func (c *Capabilities) CheckNode(n *NodeConfig) error {
	var errs []error
	if n.LocalhostNodePorts && !c.Features.Has(FeatureLocalhostNodePorts) {
		errs = append(errs, invalidf("", "localhostNodePorts", nil, ErrUnsupported,
			"%s serves no node ports on %s (kube-proxy's iptables mode alone does)", c.backend(), localhost))
	}
	switch m := n.LocalMode(); m {
	case LocalByBridgeInterface, LocalByInterfaceNamePrefix:
		if !c.Features.Has(FeatureLocalByInterface) {
			errs = append(errs, invalidf("", "detectLocal.mode", m, ErrUnsupported, "%s cannot tell pods by interface", c.backend()))
		}
	}
	return errors.Join(errs...)
}

// CheckService reports what in a valid service the backend cannot
// express: nil, or one *ValidationError per mistake, joined, each
// wrapping ErrUnsupported.
func (c *Capabilities) CheckService(s *Service) error {
	var errs []error
	if !c.AcceptsScheduler(s.Scheduler) {
		errs = append(errs, invalidf(s.Name, "scheduler", fmt.Sprintf("%q", s.Scheduler), ErrUnsupported,
			"%s honours %s", c.backend(), c.schedulerList()))
	}
	for i, p := range s.Ports {
		if !c.AcceptsProtocol(p.Protocol) {
			errs = append(errs, invalidf(s.Name, fmt.Sprintf("ports[%d].protocol", i), p.Protocol, ErrUnsupported,
				"%s carries %v", c.backend(), c.Protocols))
		}
	}
	if len(s.SourceRanges) > 0 && !c.Features.Has(FeatureSourceRanges) {
		errs = append(errs, invalidf(s.Name, "sourceRanges", nil, ErrUnsupported, "%s cannot enforce source ranges", c.backend()))
	}
	if s.Affinity.ClientIP && !c.Features.Has(FeatureAffinity) {
		errs = append(errs, invalidf(s.Name, "affinity", nil, ErrUnsupported, "%s has no session affinity", c.backend()))
	}
	return errors.Join(errs...)
}

func (c *Capabilities) schedulerList() string {
	names := []string{`"" (its default)`}
	for _, s := range c.Schedulers {
		names = append(names, fmt.Sprintf("%q", s))
	}
	return strings.Join(names, ", ")
}

// CheckPort reports what in a service port the backend cannot express: the
// service-level refusals of CheckService, and sets of endpoints larger
// than MaxEndpoints (ErrCapacity).
func (c *Capabilities) CheckPort(sp *ServicePort) error {
	var errs []error
	svc := sp.Key.Service
	if !c.AcceptsScheduler(sp.Scheduler) {
		errs = append(errs, invalidf(svc, "scheduler", fmt.Sprintf("%q", sp.Scheduler), ErrUnsupported,
			"%s honours %s", c.backend(), c.schedulerList()))
	}
	if !c.AcceptsProtocol(sp.Port.Protocol) {
		errs = append(errs, invalidf(svc, portField(sp)+".protocol", sp.Port.Protocol, ErrUnsupported,
			"%s carries %v", c.backend(), c.Protocols))
	}
	if len(sp.SourceRanges) > 0 && !c.Features.Has(FeatureSourceRanges) {
		errs = append(errs, invalidf(svc, "sourceRanges", nil, ErrUnsupported, "%s cannot enforce source ranges", c.backend()))
	}
	if sp.Affinity > 0 && !c.Features.Has(FeatureAffinity) {
		errs = append(errs, invalidf(svc, "affinity", nil, ErrUnsupported, "%s has no session affinity", c.backend()))
	}
	if m := c.MaxEndpoints; m > 0 {
		for _, set := range []struct {
			name string
			bs   []Backend
		}{{"cluster", sp.Cluster}, {"local", sp.Local}} {
			if len(set.bs) > m {
				errs = append(errs, invalidf(svc, "endpoints", len(set.bs), ErrCapacity,
					"%s serves at most %d endpoints per service port, %s has %d in its %s set", c.backend(), m, sp.Key, len(set.bs), set.name))
			}
		}
	}
	return errors.Join(errs...)
}

// portField names a service port in a ValidationError: "ports[name]".
func portField(sp *ServicePort) string { return fmt.Sprintf("ports[%q]", sp.Port.Name) }
