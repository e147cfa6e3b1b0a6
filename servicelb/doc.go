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
// hints apply), its addresses (where node ports are served), the cluster
// CIDRs that tell local traffic from outside traffic, and the masquerade
// mark.
//
// A [State] is a validated, immutable snapshot of a node and its services.
// Each service is compiled into one [ServicePort] per port and address
// family, which carries everything a backend programs: the addresses, the
// policies and the endpoints selected for it. [Diff] compares two States
// and reports which service ports were added, removed or changed, so that a
// backend rewrites only those; States built from one another share every
// unchanged service, so the comparison skips them by identity.
//
// Costs follow the change, not the size. The States one Builder hands out
// one after another share a map of their services and differ by a small
// overlay of the services changed since (folded into a new map once it
// outgrows about twice the square root of their number), so a change costs
// no copy of the whole map and Diff of two such States reads only their
// overlays: a one-service change and its Diff take about the same time
// with 10,000 services in place as with 1,000.
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
// the place. A service is invalid when it has: an empty name, one with
// characters other than letters, digits and . _ - /, or one longer than
// [MaxNameLen] (so that every kernel object named after it fits the
// kernel's limits); an invalid, unspecified, loopback, multicast, zoned or
// IPv4-mapped address, or an address listed twice; two cluster IPs of one
// family; no ports, port 0, a node port outside the node port range, two
// ports with one name, or one port number and protocol twice; a protocol
// other than TCP, UDP and SCTP; a traffic policy other than Cluster and
// Local; an affinity timeout outside 1s to 24h; an unknown scheduler hint.
// Across services, the same address, port and protocol may belong to only
// one service, and so may a node port and protocol.
//
// # Endpoint selection
//
// Selection is decided here, once, for every backend. For each service
// port and address family:
//
//   - An endpoint can serve the port if its address is of that family and
//     its weight is not zero. Its port is the one it names for the port's
//     name in [Endpoint.Ports], else the port's TargetPort, else the port
//     itself. The same address and port listed twice counts once.
//   - Ready endpoints are preferred. Only when no candidate is ready do
//     endpoints that are still serving while terminating take traffic, so
//     that a rolling update never leaves a service without backends while
//     old instances can still answer. Endpoints neither ready nor serving
//     never take traffic.
//   - The cluster set ([ServicePort.Cluster]) is chosen among all
//     candidates. Topology hints narrow it only when every ready candidate
//     carries hints: then the ready ones hinted for this node are used if
//     there are any, else those hinted for this node's zone, else hints
//     are ignored. One endpoint without hints turns hints off for the
//     whole port, because a partial set of hints cannot be trusted to
//     spread load fairly.
//   - The local set ([ServicePort.Local]) is chosen, by the same ready
//     first rule, among the candidates whose node is this node. Hints do
//     not apply to it.
//   - Traffic to the cluster IP uses the local set when the internal
//     traffic policy is Local, else the cluster set. Traffic to node
//     ports, external IPs and load-balancer IPs uses the local set when
//     the external traffic policy is Local, else the cluster set. The
//     external policy means nothing for a port with no node port and no
//     external or load-balancer address.
//   - A port whose traffic has no backend at all is rejected: the client
//     gets a TCP reset or an ICMP port unreachable at once. When one kind
//     of traffic has backends and the other has none (a Local policy and
//     no local endpoint), the traffic left without backends is dropped,
//     since another node may serve it.
//   - Weight 0 drains an endpoint: it takes no new flows, while flows it
//     already has continue. A weight spreads new flows in proportion among
//     the selected endpoints where the backend's scheduler allows it.
//
// External Local traffic keeps the client's source address; external
// Cluster traffic is masqueraded so that replies come back through this
// node. Traffic to a cluster IP from outside the cluster CIDRs is
// masqueraded too, and so is an endpoint reaching itself through its own
// service (hairpin).
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
// [Hooks] report sync durations and pending changes for metrics.
//
// Package fake provides a recording Proxier and a manual Clock for tests.
package servicelb
