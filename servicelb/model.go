package servicelb

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Protocol is a transport protocol a service port carries.
type Protocol string

// The protocols a service port may carry.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Number returns the IP protocol number (6, 17 or 132), or 0 for an unknown protocol.
func (p Protocol) Number() uint8 {
	switch p {
	case TCP:
		return 6
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 0
}

// Lower returns the protocol name in lower case ("tcp", "udp", "sctp"), as nft,
// iptables and ipvsadm print it.
func (p Protocol) Lower() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return string(p)
}

// Family is an IP address family.
type Family uint8

// The address families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// FamilyOf returns the family of a valid address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// String returns "ipv4" or "ipv6".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// Name returns "IPv4" or "IPv6": the family as Kubernetes spells it (its
// IPFamily values), which kube-proxy's metrics carry in their ip_family
// label and its /healthz in the keys of its status.
func (f Family) Name() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return f.String()
}

// Families returns both address families, IPv4 first.
func Families() []Family { return []Family{IPv4, IPv6} }

// familySet is a set of address families.
type familySet uint8

// allFamilies holds both families.
const allFamilies = familySet(1 | 2)

func familyBit(f Family) familySet {
	if f == IPv6 {
		return 2
	}
	return 1
}

func (s familySet) has(f Family) bool { return s&familyBit(f) != 0 }

// Bits returns the address length in bits (32 or 128).
func (f Family) Bits() int {
	if f == IPv6 {
		return 128
	}
	return 32
}

// TrafficPolicy says which endpoints may receive a kind of traffic.
type TrafficPolicy string

// The traffic policies. The empty policy means Cluster.
const (
	// PolicyCluster sends traffic to every usable endpoint in the cluster.
	PolicyCluster TrafficPolicy = "Cluster"
	// PolicyLocal sends traffic only to endpoints on this node and, for
	// external traffic, preserves the client's source address.
	PolicyLocal TrafficPolicy = "Local"
)

// Scheduler is a hint for the algorithm that spreads new flows over
// endpoints. Backends honour the hints they can express and refuse the others
// at Sync; the empty hint means each backend's default (random or round robin).
type Scheduler string

// The scheduler hints. The names are IPVS's.
const (
	SchedulerDefault           Scheduler = ""
	SchedulerRoundRobin        Scheduler = "rr"
	SchedulerWeightedRR        Scheduler = "wrr"
	SchedulerLeastConn         Scheduler = "lc"
	SchedulerWeightedLeastConn Scheduler = "wlc"
	SchedulerSourceHash        Scheduler = "sh"
	SchedulerDestinationHash   Scheduler = "dh"
	SchedulerShortestDelay     Scheduler = "sed"
	SchedulerNeverQueue        Scheduler = "nq"
	SchedulerMaglev            Scheduler = "mh"
	// SchedulerRandom spreads flows at random in proportion to the endpoint
	// weights: what the nftables and iptables backends do by default.
	SchedulerRandom Scheduler = "random"
)

// Schedulers returns every scheduler hint that validation accepts.
func Schedulers() []Scheduler {
	return []Scheduler{
		SchedulerDefault, SchedulerRandom, SchedulerRoundRobin, SchedulerWeightedRR,
		SchedulerLeastConn, SchedulerWeightedLeastConn, SchedulerSourceHash,
		SchedulerDestinationHash, SchedulerShortestDelay, SchedulerNeverQueue, SchedulerMaglev,
	}
}

// Port is one port of a service.
type Port struct {
	// Name identifies the port within its service and selects an
	// endpoint's target port (Endpoint.Ports). It may be empty when the
	// service has a single port.
	Name string `json:"name,omitempty"`
	// Protocol is TCP, UDP or SCTP; "" is TCP (WithDefaults).
	Protocol Protocol `json:"protocol,omitempty"`
	// Port is the port on the service's virtual addresses.
	Port uint16 `json:"port"`
	// NodePort, when not zero, also exposes the port on the node's
	// addresses (NodeConfig.NodePortAddresses).
	NodePort uint16 `json:"nodePort,omitempty"`
	// TargetPort is the endpoints' port for endpoints that do not name one
	// in Endpoint.Ports; zero means Port.
	TargetPort uint16 `json:"targetPort,omitempty"`
}

// SessionAffinity pins a client to the endpoint it first reached.
type SessionAffinity struct {
	// ClientIP turns affinity by client source address on.
	ClientIP bool `json:"clientIP,omitempty"`
	// Timeout is how long a pin lasts: a client stays on its endpoint
	// while it opens new flows less than Timeout apart (each new flow
	// renews the pin; IPVS also keeps the pin while connections it chose
	// are in its table: see FeatureAffinityExpiry). A whole number of
	// seconds from 1s to 24h; zero means DefaultAffinityTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Service is a set of virtual addresses and ports and the endpoints that
// serve them.
type Service struct {
	// Name is the service's unique key, such as "default/web".
	Name string `json:"name"`
	// ClusterIPs are the service's virtual addresses, at most one per
	// family. A service without one is reachable only through its node
	// ports, external IPs and load-balancer IPs.
	ClusterIPs []netip.Addr `json:"clusterIPs,omitempty"`
	// ExternalIPs are further addresses the node accepts the ports on.
	ExternalIPs []netip.Addr `json:"externalIPs,omitempty"`
	// LoadBalancerIPs are the addresses of an external load balancer that
	// sends traffic for the service to the node unchanged (Kubernetes'
	// ipMode VIP): the node captures them.
	LoadBalancerIPs []netip.Addr `json:"loadBalancerIPs,omitempty"`
	// ProxiedLoadBalancerIPs are the addresses of an external load
	// balancer that proxies the traffic itself, to the service's node ports
	// (Kubernetes' ipMode Proxy). The node does not capture them: traffic
	// to them, from the node or its pods too, goes to the load balancer.
	// They are validated with the service's other addresses and never
	// clash with another service's frontends.
	ProxiedLoadBalancerIPs []netip.Addr `json:"proxiedLoadBalancerIPs,omitempty"`
	// Ports lists the service's ports; at least one.
	Ports []Port `json:"ports"`
	// InternalTrafficPolicy applies to traffic to the cluster IPs.
	InternalTrafficPolicy TrafficPolicy `json:"internalTrafficPolicy,omitempty"`
	// ExternalTrafficPolicy applies to traffic to node ports, external IPs
	// and load-balancer IPs.
	ExternalTrafficPolicy TrafficPolicy `json:"externalTrafficPolicy,omitempty"`
	// Affinity is the session affinity.
	Affinity SessionAffinity `json:"affinity,omitzero"`
	// SourceRanges, when not empty, limits which client addresses may use
	// the load-balancer IPs. The node's own addresses are always allowed.
	SourceRanges []netip.Prefix `json:"sourceRanges,omitempty"`
	// HealthCheckNodePort is the port an agent serves the local-endpoint
	// health check on for services with an external Local policy.
	HealthCheckNodePort uint16 `json:"healthCheckNodePort,omitempty"`
	// Scheduler is a hint for spreading new flows over endpoints.
	Scheduler Scheduler `json:"scheduler,omitempty"`
	// Endpoints are the service's backends.
	Endpoints []Endpoint `json:"endpoints,omitempty"`
}

// Endpoint is one backend address of a service.
type Endpoint struct {
	// Addr is the backend's address. A dual-stack backend is listed once
	// per family.
	Addr netip.Addr `json:"addr"`
	// Ports maps service port names to the backend's port for them. A
	// service port not named here uses its TargetPort, unless
	// OnlyNamedPorts.
	Ports map[string]uint16 `json:"ports,omitempty"`
	// OnlyNamedPorts makes Ports the whole list of the service ports the
	// endpoint serves, as the ports of a Kubernetes EndpointSlice are:
	// the endpoint takes no traffic for a port Ports does not name.
	OnlyNamedPorts bool `json:"onlyNamedPorts,omitempty"`
	// Ready means the backend accepts new traffic. nil means ready, as a
	// Kubernetes EndpointSlice's absent condition does: set new(false) for
	// an endpoint that is not. IsReady reads it.
	Ready *bool `json:"ready,omitempty"`
	// Serving means the backend still answers, even while terminating;
	// nil means as Ready says. IsServing reads it.
	Serving *bool `json:"serving,omitempty"`
	// Terminating means the backend is going away.
	Terminating bool `json:"terminating,omitempty"`
	// NodeName is the node the backend runs on; it is local when it equals
	// NodeConfig.NodeName.
	NodeName string `json:"nodeName,omitempty"`
	// Zone is the backend's topology zone.
	Zone string `json:"zone,omitempty"`
	// Hints are topology hints: the zones and nodes that should prefer
	// this backend.
	Hints Hints `json:"hints,omitzero"`
	// Weight is the backend's relative share of new flows, from 0 to
	// 65535; nil means DefaultWeight. Weight 0 drains the backend: it takes
	// no new flows while its existing ones continue.
	Weight *uint16 `json:"weight,omitempty"`
}

// Hints are an endpoint's topology hints.
type Hints struct {
	ForZones []string `json:"forZones,omitempty"`
	ForNodes []string `json:"forNodes,omitempty"`
}

// Empty reports whether no hint is set.
func (h Hints) Empty() bool { return len(h.ForZones) == 0 && len(h.ForNodes) == 0 }

// Defaults.
const (
	DefaultWeight          = 1
	DefaultAffinityTimeout = 3 * time.Hour
	MinAffinityTimeout     = time.Second
	MaxAffinityTimeout     = 24 * time.Hour
	// MaxNameLen bounds a service name so that every kernel object named
	// after it (nft chains, IPVS and ipset comments) stays within the
	// kernel's limits.
	MaxNameLen = 128
	// MaxPortNameLen bounds a port name, as a DNS label.
	MaxPortNameLen = 63
)

// Weight returns a pointer to w, for Endpoint.Weight.
func Weight(w uint16) *uint16 { return &w }

// IsReady reports whether the endpoint accepts new traffic: Ready, or true
// when Ready is nil.
func (e *Endpoint) IsReady() bool { return e.Ready == nil || *e.Ready }

// IsServing reports whether the endpoint still answers: Serving, or
// IsReady when Serving is nil.
func (e *Endpoint) IsServing() bool {
	if e.Serving == nil {
		return e.IsReady()
	}
	return *e.Serving
}

// EffectiveWeight returns the endpoint's weight with the default applied.
func (e *Endpoint) EffectiveWeight() uint16 {
	if e.Weight == nil {
		return DefaultWeight
	}
	return *e.Weight
}

// PortRange is an inclusive range of ports.
type PortRange struct {
	Min uint16 `json:"min"`
	Max uint16 `json:"max"`
}

// Contains reports whether p lies in the range.
func (r PortRange) Contains(p uint16) bool { return p >= r.Min && p <= r.Max }

// String formats the range as "min-max".
func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// DefaultNodePortRange is the Kubernetes API server's default node port
// range (--service-node-port-range); a NodeConfig bounds nothing unless
// its NodePortRange is set.
//
// Deprecated: a variable anyone could change; kproxy reads it nowhere.
// Write the range: PortRange{Min: 30000, Max: 32767}.
var DefaultNodePortRange = PortRange{Min: 30000, Max: 32767}

// NodeConfig describes the node a proxier runs on. The zero value is usable:
// a node without name, addresses or node ports.
type NodeConfig struct {
	// NodeName decides which endpoints are local (Endpoint.NodeName).
	NodeName string `json:"nodeName,omitempty"`
	// Zone selects endpoints by topology hints.
	Zone string `json:"zone,omitempty"`
	// NodeIPs are the node's primary addresses (a Kubernetes Node's
	// addresses). Node ports are served on them unless NodePortAddresses
	// leaves them out, and source ranges admit the node by them.
	NodeIPs []netip.Addr `json:"nodeIPs,omitempty"`
	// LocalIPs are the other addresses of the node's interfaces, as
	// package nodeaddr follows them. Where neither NodePortAddresses nor
	// NodePortPrimary restricts a family, node ports are served on all of
	// them too, as kube-proxy serves them on every local address; a
	// Runner.SetNode with the new list serves an address added to an
	// interface from the next sync on.
	LocalIPs []netip.Addr `json:"localIPs,omitempty"`
	// NodePortAddresses, when set, restricts the node ports of each family
	// it has prefixes of to the addresses of NodeIPs and LocalIPs inside
	// them (kube-proxy's nodePortAddresses CIDRs; see
	// ParseNodePortAddresses). As in kube-proxy, a family without a
	// prefix is not restricted: its node ports are served on every
	// address of it.
	NodePortAddresses []netip.Prefix `json:"nodePortAddresses,omitempty"`
	// NodePortPrimary, when set, restricts the node ports of each family
	// NodeIPs has an address of to those NodeIPs (kube-proxy's "primary"
	// keyword, which it turns into the node IPs' host prefixes: a family
	// without a node IP is not restricted). It stands alone: a node with
	// both NodePortPrimary and NodePortAddresses is refused, as kube-proxy
	// refuses "primary" beside CIDRs.
	NodePortPrimary bool `json:"nodePortPrimary,omitempty"`
	// LocalhostNodePorts serves IPv4 node ports on 127.0.0.1 too, to the
	// node's own clients, as kube-proxy's iptables mode does with
	// localhostNodePorts, unless NodePortAddresses or NodePortPrimary
	// leave the loopback network out (see ServesLocalhost). It needs
	// FeatureLocalhostNodePorts (the iptables backend, which then sets
	// net.ipv4.conf.all.route_localnet=1 in its namespace, so that such
	// flows may leave the node once translated, and drops traffic to
	// 127.0.0.0/8 that arrives from elsewhere; the userspace backend,
	// which listens there; the ebpf one over the iptables backend).
	LocalhostNodePorts bool `json:"localhostNodePorts,omitempty"`
	// NodePortRange, when set, bounds Port.NodePort and
	// Service.HealthCheckNodePort: a service with a node port outside it
	// is refused. The zero range bounds nothing, as kube-proxy knows no
	// node port range: the API server allocates node ports, and a cluster
	// may widen its range (--service-node-port-range) without telling the
	// proxies.
	NodePortRange PortRange `json:"nodePortRange,omitzero"`
	// ClusterCIDRs hold the addresses of the cluster's workloads. Under
	// the default local-traffic detection (DetectLocal), traffic from them
	// is a pod's, and traffic from elsewhere to a cluster IP is
	// masqueraded, so that replies come back through this node. Empty
	// means no traffic is known to be local (and traffic to cluster IPs is
	// masqueraded only with MasqueradeAll).
	ClusterCIDRs []netip.Prefix `json:"clusterCIDRs,omitempty"`
	// DetectLocal says how the node tells the traffic of its pods from
	// other traffic; the zero value detects by ClusterCIDRs.
	DetectLocal DetectLocal `json:"detectLocal,omitzero"`
	// ServiceCIDRs hold every cluster IP. When set, traffic to an address
	// in them that is no service's cluster IP is dropped (backends read
	// them as DroppedServiceCIDRs resolves them). Traffic to a cluster IP
	// on a port no service has is rejected either way.
	ServiceCIDRs []netip.Prefix `json:"serviceCIDRs,omitempty"`
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool `json:"masqueradeAll,omitempty"`
	// MasqueradeBit is the packet mark bit (0-31) that tags traffic for
	// masquerade; zero means 14 (mark 0x4000), as kube-proxy.
	MasqueradeBit uint8 `json:"masqueradeBit,omitempty"`
}

// LocalMode is how a node recognises the traffic of its pods: kube-proxy's
// --detect-local-mode.
type LocalMode string

// The local-traffic detection modes.
const (
	// LocalByClusterCIDR: a flow whose source lies in
	// NodeConfig.ClusterCIDRs is a pod's. The default.
	LocalByClusterCIDR LocalMode = "ClusterCIDR"
	// LocalByNodeCIDR: a flow whose source lies in DetectLocal.NodeCIDRs,
	// the pod CIDRs of this node, is a pod's.
	LocalByNodeCIDR LocalMode = "NodeCIDR"
	// LocalByBridgeInterface: a flow that came in on the bridge
	// DetectLocal.BridgeInterface is a pod's.
	LocalByBridgeInterface LocalMode = "BridgeInterface"
	// LocalByInterfaceNamePrefix: a flow that came in on an interface
	// whose name starts with DetectLocal.InterfaceNamePrefix is a pod's.
	LocalByInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// LocalModes returns every mode validation accepts besides the empty one.
func LocalModes() []LocalMode {
	return []LocalMode{LocalByClusterCIDR, LocalByNodeCIDR, LocalByBridgeInterface, LocalByInterfaceNamePrefix}
}

// Interface name limits: the kernel's IFNAMSIZ less its terminating NUL.
// A name prefix is one shorter, so that the prefix and the wildcard that
// marks it in iptables ("veth+") fit the same field.
const (
	MaxInterfaceNameLen   = 15
	MaxInterfacePrefixLen = MaxInterfaceNameLen - 1
)

// DetectLocal says how the node recognises the traffic of its pods, the
// FromPod origin: by its source address (ClusterCIDR, NodeCIDR modes) or
// by the interface it came in on (BridgeInterface, InterfaceNamePrefix
// modes). Only the parameter of the chosen mode may be set.
type DetectLocal struct {
	// Mode is the detection; empty means LocalByClusterCIDR with
	// NodeConfig.ClusterCIDRs optional (without them no flow is a
	// pod's). Every other mode needs its parameter.
	Mode LocalMode `json:"mode,omitempty"`
	// NodeCIDRs are the node's pod CIDRs (a Kubernetes Node's
	// spec.podCIDRs), for LocalByNodeCIDR. A family without one has no
	// pods to tell apart.
	NodeCIDRs []netip.Prefix `json:"nodeCIDRs,omitempty"`
	// BridgeInterface names the bridge the node's pods are attached to
	// (such as "cbr0"), for LocalByBridgeInterface.
	BridgeInterface string `json:"bridgeInterface,omitempty"`
	// InterfaceNamePrefix starts the names of the node's interfaces to
	// its pods (such as "veth" or "cali"), for LocalByInterfaceNamePrefix.
	InterfaceNamePrefix string `json:"interfaceNamePrefix,omitempty"`
}

// LocalMatch is how a backend recognises, in one address family, the
// flows of the node's pods: by a source in CIDRs, or by the interface they
// came in on. It is NodeConfig.DetectLocal resolved for the family, and
// the only part of it backends read. The zero value recognises no flow:
// then every origin but the node is outside.
//
// A flow the node itself sends has no input interface, so with Interface
// it is never a pod's; with CIDRs it is when its source lies in them.
type LocalMatch struct {
	// CIDRs, when not empty, hold the sources of the pods' flows: none
	// inside another, ordered by address.
	CIDRs []netip.Prefix
	// Interface, when not empty, is the interface the pods' flows come in
	// on or, with Prefix, the start of its name.
	Interface string
	Prefix    bool
}

// Detects reports whether the match recognises any flow as a pod's.
func (m LocalMatch) Detects() bool { return len(m.CIDRs) > 0 || m.Interface != "" }

// LocalMode returns the node's local-traffic detection mode with the
// default applied.
func (n *NodeConfig) LocalMode() LocalMode {
	if n.DetectLocal.Mode == "" {
		return LocalByClusterCIDR
	}
	return n.DetectLocal.Mode
}

// LocalMatch returns how the flows of the node's pods are recognised in
// family f.
func (n *NodeConfig) LocalMatch(f Family) LocalMatch {
	d := &n.DetectLocal
	switch n.LocalMode() {
	case LocalByClusterCIDR:
		return LocalMatch{CIDRs: disjointPrefixes(prefixesOf(n.ClusterCIDRs, f))}
	case LocalByNodeCIDR:
		return LocalMatch{CIDRs: disjointPrefixes(prefixesOf(d.NodeCIDRs, f))}
	case LocalByBridgeInterface:
		return LocalMatch{Interface: d.BridgeInterface}
	case LocalByInterfaceNamePrefix:
		return LocalMatch{Interface: d.InterfaceNamePrefix, Prefix: true}
	}
	return LocalMatch{}
}

// DroppedServiceCIDRs returns the prefixes of family f in which a new
// flow to an address that is no frontend of a service port is dropped:
// NodeConfig.ServiceCIDRs of the family, none inside another, ordered by
// address (kube-proxy's cluster-ips-check). A flow to a cluster IP that a
// service port holds, on a port none has, is rejected instead (see
// FeatureUndefinedPorts), as is one to a cluster IP outside them. They
// are the only part of the service CIDRs backends read.
func (n *NodeConfig) DroppedServiceCIDRs(f Family) []netip.Prefix {
	return disjointPrefixes(prefixesOf(n.ServiceCIDRs, f))
}

// PodsByNamespace reports whether the node's local-traffic detection
// calls every flow from a pod's own network namespace on this node a
// pod's (FromPod), whatever its address and the interface it comes in
// on: under LocalByClusterCIDR, whose premise is that pods take their
// addresses from the cluster CIDRs. The other modes tell pods by the
// node's pod CIDRs or by an interface, which a hook that sees only the
// socket's namespace cannot know: to it, such a flow may be FromPod or
// FromOutside.
func (n *NodeConfig) PodsByNamespace() bool { return n.LocalMode() == LocalByClusterCIDR }

// DetectsLocal reports whether the node tells the flows of its pods apart
// in family f.
func (n *NodeConfig) DetectsLocal(f Family) bool {
	switch n.LocalMode() {
	case LocalByClusterCIDR:
		return hasFamily(n.ClusterCIDRs, f)
	case LocalByNodeCIDR:
		return hasFamily(n.DetectLocal.NodeCIDRs, f)
	}
	return n.LocalMatch(f).Detects()
}

func hasFamily(ps []netip.Prefix, f Family) bool {
	for _, p := range ps {
		if FamilyOf(p.Addr()) == f {
			return true
		}
	}
	return false
}

// DefaultMasqueradeBit is kube-proxy's masquerade mark bit.
const DefaultMasqueradeBit = 14

// MasqueradeMark returns the mark that tags packets for masquerade.
func (n *NodeConfig) MasqueradeMark() uint32 {
	b := n.MasqueradeBit
	if b == 0 {
		b = DefaultMasqueradeBit
	}
	return 1 << b
}

// Ports returns the node ports a service may have: NodePortRange, or
// every port when it is not set.
func (n *NodeConfig) Ports() PortRange {
	if n.NodePortRange == (PortRange{}) {
		return PortRange{Min: 1, Max: 65535}
	}
	return n.NodePortRange
}

// Localhost is where LocalhostNodePorts serves node ports: 127.0.0.1.
//
// Deprecated: a variable anyone could change; kproxy reads it nowhere.
// Compare with netip.AddrFrom4([4]byte{127, 0, 0, 1}).
var Localhost = localhost

// localhost is where LocalhostNodePorts serves node ports.
var localhost = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// NodePortIPs returns the node addresses of family f that serve node
// ports: NodeIPs first, in their order, then LocalIPs, then 127.0.0.1
// (see the fields for which).
func (n *NodeConfig) NodePortIPs(f Family) []netip.Addr {
	serves := n.servesNodePorts(f)
	var out []netip.Addr
	for _, a := range n.NodeIPs {
		if FamilyOf(a) == f && serves(a, true) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, a := range n.LocalIPs {
		if FamilyOf(a) == f && serves(a, false) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if f == IPv4 && n.ServesLocalhost() {
		out = append(out, localhost)
	}
	return out
}

// ServesLocalhost reports whether node ports are served on 127.0.0.1:
// with LocalhostNodePorts, unless the node ports of IPv4 are restricted
// to addresses that leave out the loopback network, as kube-proxy turns
// its localhostNodePorts off when nodePortAddresses does not hold
// 127.0.0.0 ("primary" selecting the node IPs, CIDRs none of which is
// loopback or holds 127.0.0.0).
func (n *NodeConfig) ServesLocalhost() bool {
	if !n.LocalhostNodePorts || (n.NodePortPrimary && len(n.IPs(IPv4)) > 0) {
		return false
	}
	ps := prefixesOf(n.NodePortAddresses, IPv4)
	return len(ps) == 0 || slices.ContainsFunc(ps, func(p netip.Prefix) bool {
		return p.Addr().IsLoopback() || p.Contains(loopbackNet)
	})
}

// loopbackNet is the address of IPv4's loopback network, 127.0.0.0.
var loopbackNet = netip.AddrFrom4([4]byte{127, 0, 0, 0})

// servesNodePorts returns which addresses of family f serve node ports,
// told whether each is a node IP, by kube-proxy's rules for
// nodePortAddresses, which it applies to each family apart: "primary"
// selects the node IPs of a family that has one, CIDRs the addresses
// inside those of the family, and a family neither restricts is served on
// every address.
func (n *NodeConfig) servesNodePorts(f Family) func(a netip.Addr, nodeIP bool) bool {
	if n.NodePortPrimary && len(n.IPs(f)) > 0 {
		return func(_ netip.Addr, nodeIP bool) bool { return nodeIP }
	}
	if ps := prefixesOf(n.NodePortAddresses, f); len(ps) > 0 {
		return func(a netip.Addr, _ bool) bool { return prefixesContain(ps, a) }
	}
	return func(netip.Addr, bool) bool { return true }
}

// NodePortPrimaryKeyword is the entry of kube-proxy's nodePortAddresses
// that selects the node's primary addresses (NodeConfig.NodePortPrimary).
const NodePortPrimaryKeyword = "primary"

// ParseNodePortAddresses parses kube-proxy's nodePortAddresses into
// NodeConfig's NodePortAddresses and NodePortPrimary, by kube-proxy's
// rules: either the keyword "primary" alone, or CIDRs, each read as
// kube-proxy reads them (Kubernetes' ParseCIDRSloppy: IPv4 numbers may
// have leading zeros, and host bits are dropped, so that 10.0.0.1/8 is
// 10.0.0.0/8). An empty list selects every local address. Each bad entry
// is a *ValidationError naming it: one that is no CIDR wraps
// ErrInvalidPrefix, "primary" beside CIDRs ErrInvalidNode.
func ParseNodePortAddresses(list []string) ([]netip.Prefix, bool, error) {
	var prefixes []netip.Prefix
	primary := false
	var errs []error
	for i, s := range list {
		field := fmt.Sprintf("nodePortAddresses[%d]", i)
		if s == NodePortPrimaryKeyword {
			if len(list) > 1 && !primary {
				errs = append(errs, invalidf("", field, s, ErrInvalidNode, "%q stands alone, not beside CIDRs", s))
			}
			primary = true
			continue
		}
		p, err := parsePrefixSloppy(s)
		if err == nil {
			err = checkPrefix(p)
		}
		if err != nil {
			errs = append(errs, invalidf("", field, s, ErrInvalidPrefix, "want a CIDR or %q", NodePortPrimaryKeyword))
			continue
		}
		prefixes = append(prefixes, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	return prefixes, primary, nil
}

// parsePrefixSloppy parses a CIDR as Kubernetes' ParseCIDRSloppy does:
// the numbers of an IPv4 address (a whole one, or the end of an IPv6 one)
// and the prefix length may have leading zeros, read as decimal; host
// bits are dropped.
func parsePrefixSloppy(s string) (netip.Prefix, error) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		return netip.Prefix{}, errors.New("no prefix length")
	}
	// The IPv4 numbers: the whole address, or the end of an IPv6 one.
	if i := strings.LastIndexByte(addr, ':') + 1; strings.Contains(addr[i:], ".") {
		addr = addr[:i] + dropLeadingZeros(addr[i:], ".")
	}
	p, err := netip.ParsePrefix(addr + "/" + dropLeadingZeros(bits, ""))
	if err != nil {
		return netip.Prefix{}, err
	}
	return p.Masked(), nil
}

// dropLeadingZeros removes the leading zeros of each number of s, the
// numbers split at sep (none: s is one number); a number of zeros alone
// keeps one.
func dropLeadingZeros(s, sep string) string {
	parts := []string{s}
	if sep != "" {
		parts = strings.Split(s, sep)
	}
	for i, n := range parts {
		if t := strings.TrimLeft(n, "0"); t != n {
			parts[i] = cmp.Or(t, "0")
		}
	}
	return strings.Join(parts, sep)
}

// IPs returns the node addresses of family f.
func (n *NodeConfig) IPs(f Family) []netip.Addr { return addrsOf(n.NodeIPs, f) }

// Local reports whether the endpoint runs on this node.
func (n *NodeConfig) Local(e *Endpoint) bool {
	return n.NodeName != "" && e.NodeName == n.NodeName
}

func prefixesContain(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func addrsOf(as []netip.Addr, f Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range as {
		if FamilyOf(a) == f {
			out = append(out, a)
		}
	}
	return out
}

// prefixesOf returns the prefixes of family f, in a slice of their own.
func prefixesOf(ps []netip.Prefix, f Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if FamilyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// disjointPrefixes returns the prefixes of ps that no other one of them
// contains, masked and ordered by address: the same addresses, as a
// kernel's interval set holds them (it refuses overlapping intervals). It
// may reorder ps.
func disjointPrefixes(ps []netip.Prefix) []netip.Prefix {
	for i := range ps {
		ps[i] = ps[i].Masked()
	}
	// Two prefixes are nested or apart. Ordered by address, the shorter
	// of two with one address first, a prefix inside a kept one comes
	// right after it or after others inside it: the last kept one is the
	// only one to check.
	slices.SortFunc(ps, comparePrefixes)
	var out []netip.Prefix
	for _, p := range ps {
		if n := len(out); n == 0 || !out[n-1].Contains(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}
