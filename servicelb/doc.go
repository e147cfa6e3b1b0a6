// Package servicelb is kproxy's model of services and the engine that feeds
// them to a kernel dataplane. It is pure Go: no kernel calls, no Kubernetes
// types, no golang.org/x/sys/unix (a test keeps it so).
//
// # The model
//
// A [Service] is a set of virtual addresses (one cluster IP per family,
// external IPs, load-balancer IPs) and [Port]s, with the [Endpoint]s that
// serve it. A [NodeConfig] describes the node a proxier runs on: its name
// and zone (which decide which endpoints are local and which topology
// hints apply), its addresses (where node ports are served), how it tells
// the traffic of its pods from outside traffic (the cluster CIDRs, or
// another local-traffic detection), and the masquerade mark. Its fields
// are kube-proxy's node options:
//
//	kube-proxy                          NodeConfig
//	hostnameOverride                    NodeName
//	the Node's addresses                NodeIPs
//	nodePortAddresses (CIDRs, primary)  NodePortAddresses, NodePortPrimary; LocalIPs (package nodeaddr)
//	iptables.localhostNodePorts         LocalhostNodePorts (FeatureLocalhostNodePorts)
//	clusterCIDR                         ClusterCIDRs
//	detectLocalMode, detectLocal.*      DetectLocal
//	service CIDRs                       ServiceCIDRs
//	masqueradeAll                       MasqueradeAll
//	iptables.masqueradeBit              MasqueradeBit
//	syncPeriod, minSyncPeriod           RunnerOptions.MaxSyncInterval, MinSyncInterval
//
// Those kproxy keeps elsewhere (conntrack tuning, health servers, IPVS's
// strict ARP) and those it leaves out, with why, are listed in the
// repository's docs/kube-proxy-options.md.
//
// A [State] is a validated, immutable snapshot of a node and its services.
// Each service is compiled into one [ServicePort] per port and address
// family: the complete decision for that port, which is everything a
// backend programs and all it may read. Backends render ServicePorts; they
// decide nothing about what a service means, so every backend gives the
// same packets the same fate, and [Diff], which compares every field of a
// ServicePort, reports every change a backend must apply. States built
// from one another share every unchanged service, so a change and its Diff
// cost what changed, not what is there.
//
// Build a State with [NewState] (all or nothing) or incrementally with a
// [Builder] (each change validated on its own). Feed a [Proxier] by hand,
// or let a [Runner] do it.
//
// # Validation
//
// Nothing invalid reaches a Proxier. Validation reports every mistake as a
// *[ValidationError] naming the service and the field, wrapping one of the
// Err* kinds, so that callers use errors.Is for the kind and errors.As for
// the place. A node is invalid when it has an invalid address or prefix, a
// node port range or masquerade bit out of range, NodePortPrimary beside
// NodePortAddresses (kube-proxy's "primary" stands alone), an unknown
// local-traffic detection mode, a mode without its parameter (cluster
// CIDRs for an explicit ClusterCIDR, node CIDRs for NodeCIDR, the
// interface name or prefix for the others) or with another mode's, or an
// interface name that is not one (longer than [MaxInterfaceNameLen], a
// prefix longer than [MaxInterfacePrefixLen], or characters other than
// letters, digits and . _ -). A service is invalid when it has: an empty name, one with
// characters other than letters, digits and . _ - /, or one longer than
// [MaxNameLen] (so that every kernel object named after it fits the
// kernel's limits); an invalid, unspecified, loopback, multicast, zoned or
// IPv4-mapped address, or an address listed twice; two cluster IPs of one
// family; no ports, port 0, a node port outside NodeConfig.NodePortRange
// when one is set, two
// ports with one name, one port number and protocol twice, or a health
// check node port that is one of its own TCP node ports; a protocol other
// than TCP, UDP and SCTP; a traffic policy other than Cluster and Local;
// an affinity timeout that is not a whole number of seconds from 1s to
// 24h; an unknown scheduler hint.
//
// Each backend declares its [Capabilities]: the scheduler hints it
// honours, the protocols it carries, the endpoints one port may have, the
// features it implements (detecting pods by interface among them). A
// Runner refuses a service that does not fit (ErrUnsupported,
// ErrCapacity) at its source, before the kernel, and keeps applying
// everything else; a backend checks each port it plans with
// [Capabilities.CheckPort], so the error is the same on every backend. A
// node the backend cannot serve ([Capabilities.CheckNode]) is refused by
// NewRunner and by every Sync. A service whose kernel objects the kernel
// itself refuses as they are written (ErrRefused) is left out of that
// Sync and the rest applied ([SyncReport].LeftOut), until it changes. The
// features also decide which scenarios of the conformance kit (package
// conformance) apply to a backend; its conformance test names those that
// do not, so that a feature it loses fails the test instead of leaving
// scenarios unrun.
//
// Two services may ask for one frontend (the same address, protocol and
// port, or the same node port). They are both served; the frontend stays
// with the service that held it first, so that a service added by mistake
// never takes a working one's address, and among services that arrive
// together it goes by rule: a virtual address before a node port on that
// address, then the service whose name sorts first. [State.Conflicts] and
// the Runner's Hooks.Conflicts report the clash; the other service keeps
// all its other frontends.
//
// # Endpoint selection
//
// For each service port and address family:
//
//   - An endpoint can serve the port if its address is of that family, its
//     weight is not zero, and it serves the port: its port is the one it
//     names for the port's name in [Endpoint.Ports], else (unless
//     [Endpoint.OnlyNamedPorts]) the port's TargetPort, else the port
//     itself. The same address and port listed twice counts once: as
//     kube-proxy's endpoint slice cache, the first listed stays, unless a
//     later one runs on this node (an endpoint that two sources list,
//     one of them as local, is local).
//   - Ready endpoints are preferred ([Endpoint.IsReady]: an endpoint is
//     ready unless its Ready says otherwise, as a Kubernetes EndpointSlice's
//     absent condition is, in Go and in the JSON encoding alike; Serving
//     left out is as Ready says). Only when no candidate is ready do
//     endpoints that are still serving while terminating take traffic, so
//     that a rolling update never leaves a service without backends while
//     old instances can still answer. Endpoints neither ready nor serving
//     never take traffic.
//   - The cluster set ([ServicePort.Cluster]) is chosen among all
//     candidates. Topology hints narrow its ready candidates as
//     kube-proxy's topologyModeFromHints does: to those hinted for this
//     node when every ready candidate has a node hint and one names this
//     node; else to those hinted for this node's zone when every ready
//     candidate has a zone hint and one names the zone; else not at all.
//     Hints of the two kinds are judged apart, so a set of mixed hints
//     (during a change of trafficDistribution) does not crowd a node's
//     traffic onto one endpoint.
//   - The local set ([ServicePort.Local]) is chosen, by the same ready
//     first rule, among the candidates whose node is this node. Hints do
//     not apply to it.
//   - Weight 0 drains an endpoint: it takes no new flows, while flows it
//     already has continue. A weight spreads new flows in proportion among
//     the selected endpoints where the backend's scheduler allows it.
//
// # What happens to a new flow
//
// A backend tells three origins of traffic apart ([Origin]): a pod of
// this node, as the node's local-traffic detection recognises it (below),
// else the node itself (a local source address), else a client outside.
// For each kind of frontend and each origin, the ServicePort holds a
// [Verdict]: forward to the cluster set or the local set, masqueraded or
// not, or reject, or drop.
//
// NodeConfig.DetectLocal chooses what "a pod of this node" means, as
// kube-proxy's --detect-local-mode does ([NodeConfig.LocalMatch] is the
// resolved rule every backend renders):
//
//   - ClusterCIDR (the default): a flow whose source lies in the cluster
//     CIDRs of its family (NodeConfig.ClusterCIDRs). Without cluster CIDRs
//     of a family, no flow of it is a pod's. Pods of other nodes whose
//     flows reach this one unmasqueraded count as pods too.
//   - NodeCIDR: a flow whose source lies in the node's own pod CIDRs of
//     its family (DetectLocal.NodeCIDRs, a Node's spec.podCIDRs). A pod
//     of another node is outside.
//   - BridgeInterface: a flow that came in on the bridge the node's pods
//     hang on (DetectLocal.BridgeInterface, such as cbr0), in either
//     family.
//   - InterfaceNamePrefix: a flow that came in on an interface whose name
//     starts with DetectLocal.InterfaceNamePrefix (such as veth), in
//     either family.
//
// A flow a process of the node sends comes in on no interface, so the
// interface modes never count it as a pod's (the source modes do when its
// source lies in their CIDRs); it is the node's. Every rule below that
// speaks of pods and of traffic from outside the cluster follows the same
// detection, the masquerade of traffic to cluster IPs included: what the
// detection does not recognise is from outside (or the node), as in
// kube-proxy, whose IfLocal and IfNotLocal matches come from one detector.
//
// The verdicts follow kube-proxy's iptables mode:
//
//   - A port no endpoint serves anywhere rejects every flow at once with an
//     ICMP (ICMPv6) port unreachable, which a TCP client sees as a refused
//     connection. (A backend that terminates connections instead of
//     translating packets resets the TCP and SCTP flows it rejects or
//     drops; it says so by lacking FeaturePacketVerdicts.)
//   - Traffic to the cluster IP takes the set of the internal traffic
//     policy, from every origin, and is dropped when that set is empty
//     (another node may serve it). It is masqueraded from outside and from
//     the node when the node detects its pods in the family (by interface,
//     or with CIDRs of the family); from every origin with MasqueradeAll;
//     otherwise never.
//   - Traffic to node ports, external IPs and load-balancer IPs under the
//     external Cluster policy takes the cluster set and is masqueraded,
//     so that replies come back through this node.
//   - Under the external Local policy, traffic from outside takes the local
//     set with the client's address kept, and is dropped on a node without
//     a local endpoint. Traffic from a pod takes the cluster set
//     unmasqueraded, and from the node the cluster set masqueraded, as if it
//     had gone out to a load balancer and come back: a node or pod reaches
//     an externally visible service wherever its endpoints are. Where the
//     node does not detect its pods, a pod cannot be told apart and counts
//     as outside.
//   - A flow forwarded from an endpoint to itself (hairpin) is masqueraded,
//     so the endpoint's reply comes back through the node.
//   - Load-balancer source ranges ([ServicePort.SourceRanges]) drop the
//     flows to load-balancer IPs from other sources. The node is admitted
//     only through the ranges, and when a node address lies in them the
//     load-balancer IPs are admitted as sources too (the node reaching a
//     load-balancer IP it holds). Ranges of one family never close the
//     other family.
//   - A flow to a cluster IP (a ServicePort's ClusterIP) on a port no
//     service port has is rejected, and with NodeConfig.ServiceCIDRs one
//     to an address of the service CIDRs that is no cluster IP is dropped
//     (kube-proxy's cluster-ips-check). Backends read the service CIDRs
//     only as [NodeConfig.DroppedServiceCIDRs] resolves them for a family.
//     Traffic to external and load-balancer IPs on other ports is not the
//     proxier's; a backend that must hold those addresses on the node
//     rejects it.
//   - ClientIP affinity pins a client to the endpoint it first reached;
//     the pin lasts while the client opens new flows less than the timeout
//     apart.
//
// # Stale flows
//
// A UDP or SCTP flow keeps its translation as long as its client keeps
// sending. After a change, a flow to a frontend is stale when its endpoint
// no longer serves the port: [StaleFlow] keeps the flows of every serving
// endpoint, whatever the policies, topology, weights or the terminating
// fallback select, so that a UDP session lasts as a TCP connection does.
// A flow is cut only where a serving endpoint can take its client's next
// datagram: a frontend that no endpoint serves any longer (its last
// endpoint turned unready under load but still answers), or that went
// away (its service deleted, its port or address removed), keeps its
// flows until they idle out, as kube-proxy leaves them from 1.31 on.
// [Changes.StaleFlows] lists the frontends a change touched; a State's
// [State.StaleFlows] lists them all, to reconcile a whole conntrack table
// with the state after a restart.
//
// # Asking why
//
// [State.Explain] tells what the state decides for one new flow and why:
// the frontend it hits, the verdict and its reasons, the endpoints it may
// go to with their weights, each endpoint left out with its reason, and
// the clashes over the frontend. It reads only what the backends read, so
// it cannot disagree with them; [Explanation.Text] and the JSON form
// ([ExplanationSchema]) show it. A backend that gives the kernel's word
// ([FlowChecker], every backend of this module) reads back what serves
// an explained flow (rules, elements, virtual servers, map entries,
// listeners) and reports where the kernel differs from the explanation;
// one whose rules live in nf_tables ([Tracer]: nftables, iptables)
// follows the next packet of a flow through its rules with the kernel's
// trace events. The conformance kit checks every flow it sends against
// its explanation and the kernel's word.
//
// # The Runner
//
// A [Runner] takes changes from named [Source]s (an informer, a file, a
// service catalog): upserts, deletes and whole replacements. It validates
// each change as it arrives (a bad service is reported to its source and
// left out, its last good version kept), coalesces changes, syncs no more
// often than MinSyncInterval and at least every MaxSyncInterval, retries
// failures with exponential backoff, and never syncs before every
// registered source has delivered its initial contents: a restarted agent
// never applies a partial state. [Runner.Run] returns when its context
// ends. [Runner.Health] compares what is queued with what is applied, and
// [Hooks] report for metrics sync durations, full or partial
// ([SyncReport].Full), changes pending and taken by kind (a service's
// endpoints alone, or more: [ChangeStats]) and when each applied change
// was caused ([Source.UpsertTriggered]), and hand every applied State to
// what must follow the kernel, such as the health check node ports
// ([State.HealthCheck] decides what they answer; package healthcheck
// serves them). Both also tell each address family the proxier programs
// apart ([SyncResult.Families], [Health.Families]), as kube-proxy runs
// and reports a proxier per family: a change counts in the families whose
// endpoints it changed and, for any other change, in those the service is
// served in.
//
// Package fake provides a recording Proxier and a manual Clock for tests.
package servicelb
