// Package userspace is a servicelb.Proxier that serves service ports from
// user space, in the manner of kube-proxy's first mode: it listens on a
// socket per frontend, and copies each connection it accepts (each UDP
// client's datagrams) to an endpoint over a connection of its own. It
// writes no packet filter rules and needs no privilege of its own, so it
// programs load balancing where nothing else can: rootless containers, CI
// runners, developer laptops, sandboxes, kernels without nf_tables.
//
// What a flow to a service means (which endpoints take it from which
// origin, reject or drop, source ranges, affinity, which flows are stale)
// is decided by package servicelb and documented there; each
// servicelb.ServicePort carries its verdicts, and this package carries
// them out for each new connection or UDP session. Capabilities says what
// it cannot do (see Limits).
//
// # Where it listens
//
// A frontend of a service port (its cluster IP, external IPs and
// load-balancer IPs with the port, the node addresses with the node port)
// is served by a listener on its own address and port, unless
// Options.Listen puts it elsewhere (ListenAt: one address and port per
// service port) or leaves it out. Such a listener can only be opened on
// an address the namespace has:
//
//   - With Options.HoldAddresses (CAP_NET_ADMIN in the namespace), the
//     proxy puts every such address that is not a node address on
//     Options.Link (the loopback by default, or a dummy link it creates),
//     so that the kernel takes traffic to a cluster IP, an external or
//     load-balancer IP in locally, from other hosts, the node's pods and
//     the node itself alike, and the listener accepts it: no packet is
//     rewritten. The addresses are marked as the proxy's (their protocol,
//     Options.AddressProtocol), so that a restarted proxy adopts them and
//     Cleanup removes them and nothing else. An address someone else put
//     on the node serves as well and stays theirs. The held addresses are
//     the node's own to the kernel, which answers ARP for them on every
//     link: with an external or load-balancer IP that a neighbour or an
//     announcer (MetalLB's L2 mode) owns, set Options.StrictARP, as for
//     the ipvs backend (servicelb.FeatureNoARPAnswers). Node ports listen on
//     the node addresses, which the node has anyway. The held addresses
//     are not the node's: leave the link out of the listing that makes
//     NodeConfig.LocalIPs (nodeaddr.Options.ExcludeInterfaces), or node
//     ports listen on them too (an address the proxy holds that the node
//     config lists stays held).
//   - Without privileges, the proxy listens where it may: node ports on
//     the node's own addresses and on 127.0.0.1 (NodeConfig's
//     LocalhostNodePorts), and the addresses and ports Options.Listen
//     gives, such as 127.0.0.1 and a port of its own per service port
//     (ListenAt). A port below net.ipv4.ip_unprivileged_port_start needs
//     CAP_NET_BIND_SERVICE.
//
// A frontend it cannot listen on (an address the node lacks, a port
// someone else holds) leaves its service out: Sync's report names it
// (servicelb.SyncReport.LeftOut, a *ListenError inside) and the rest is
// served.
//
// # What happens to a new flow
//
// For each connection it accepts (each first datagram of a UDP client),
// the proxy tells the flow's origin from its source address as servicelb
// defines origins: a pod when the source lies in the prefixes of the
// node's local-traffic detection (NodeConfig.LocalMatch: the cluster
// CIDRs, or the node's own pod CIDRs), else the node when the source is
// the flow's own destination, a loopback address or one of NodeConfig's
// NodeIPs and LocalIPs (the addresses a process of the node sends from),
// else outside. A node that tells its pods by interface
// (servicelb.LocalByBridgeInterface, LocalByInterfaceNamePrefix) has them
// told by the interface a flow came in on: the one of a TCP connection's
// first packet, of a UDP client's first datagram, and for SCTP, whose
// sockets do not tell it, the one the node routes the client's address
// through. The verdict of that origin for the kind of frontend the
// listener serves says what follows:
//
//   - Forward: the proxy picks an endpoint of the verdict's set (the
//     cluster or the local endpoints), the one the client is pinned to
//     under ClientIP affinity or else by the scheduler: weighted random
//     by default and for "random", smooth weighted round robin for "wrr"
//     (every endpoint takes exactly its weight of each cycle of new
//     flows) and plain round robin for "rr". Endpoints of weight 0 are
//     never in a set. It connects within Options.ConnectTimeout and, when
//     the endpoint refuses or does not answer, tries another, up to
//     Options.DialAttempts; a pin to an endpoint that failed is dropped.
//     A connection whose every attempt failed is reset.
//   - Reject: a port that no endpoint serves anywhere has no listener,
//     its address stays held, and the kernel refuses its flows at once:
//     a TCP client gets a reset (an SCTP one an abort), a UDP client an
//     ICMP port unreachable.
//   - Drop: a TCP or SCTP connection has been accepted by the time the
//     proxy sees it, so it is reset; a UDP datagram is discarded.
//     Connections from outside a load-balancer frontend's source ranges
//     are dropped so too.
//
// A pin lasts while its client opens new flows less than the affinity
// timeout apart.
//
// # Copying
//
// TCP: both directions of a connection are moved with splice(2) through a
// pipe, from one socket to the other, so the bytes never enter user
// space; a direction holds a pipe only while bytes are in it, so an idle
// connection holds two sockets and two parked goroutines and nothing
// more. The end of one direction is passed on (a half-close: the other
// direction goes on), a reset or failure on either side resets both at
// once, and a connection that moves nothing either way for
// Options.IdleTimeout is closed. A receiver that takes none of the bytes
// the proxy holds for it for Options.StallTimeout (5 minutes) has its
// connection reset, so that a peer that stopped reading cannot keep a
// pipe of bytes and the sockets' buffers for the idle timeout: not even
// after the client that sent them left, whose end of stream waits
// behind the bytes the proxy has not read and so never reaches it (100
// such clients held 100 pipes, 1 MiB each, until the idle timeout; now
// until StallTimeout). Keepalives run on both sides. A socket whose peer is near (a
// round trip under 200 µs, as the kernel measured it during the
// handshake: the node itself, its pods, its network's hosts) has its
// kernel buffers capped at 512 KiB, which still covers the
// bandwidth-delay product of such a path: the kernel's autotuning would
// grow them to several MiB, and the bytes waiting there leave the
// processor's caches before the endpoint reads them. A socket whose peer
// is farther keeps the autotuning, which its window needs.
//
// UDP: one socket per listener, bound to the frontend's own address, so
// that replies come from the address the client sent to. Each client
// address and port is a session with a socket connected to the endpoint
// it reached; the endpoint's replies go back to the client from the
// listener. The session's socket is what tells its replies from other
// clients' (they come back to its own port: the proxy is not
// transparent, so it cannot send from the client's address); nothing else
// of a session waits: one goroutine waits for every session's replies
// (epoll) and ends the sessions that idled. A session ends after Options.UDPIdleTimeout without a
// datagram either way (30 s by default, where kube-proxy's userspace mode
// had 250 ms, which cut any protocol slower to answer), or
// Options.UDPStreamTimeout (120 s) once it is a stream (it has had a
// reply and carries datagrams 2 s after it began), as conntrack keeps its
// UDP flows for the kernel's backends; when its endpoint
// refuses (an ICMP port unreachable), or when its endpoint stops serving;
// a listener holds at most Options.MaxUDPSessions. When the listener, or
// the flow budget (below), holds its most, a new client takes the place
// of the listener's oldest session that has had no reply, as conntrack
// drops its unreplied entries first when its table is full, so that a
// flood of clients that get no answer cannot keep the others out; only
// when every session has had a reply is the new client's datagram
// dropped.
//
// Flows are bounded: the proxy holds at most Options.MaxFlows connections
// and UDP sessions at once (by default what the process's descriptor
// limit leaves after a reserve of a tenth for everything else), and a
// service port at most Options.MaxPortFlows (half of them), so that a
// flood of connections to one service cannot take the descriptors every
// other service, the health and metrics servers and the agent need. A
// flow beyond either bound is shed at once: a connection is reset before
// any endpoint is dialled, a new UDP client's datagram dropped; it is
// counted (PortStats.Shed) and warned of at most every 10 s. With 1,500
// idle connections held to one service under the budget of 1,024
// descriptors, another service answered 40 of 40 TCP connections and UDP
// clients (11 of 20 before the budget, 4 of 20 over UDP). A want of
// descriptors or memory met anyway (EMFILE, ENFILE, ENOBUFS, ENOMEM) is
// the node's, not an endpoint's: it is counted as PortStats.LocalErrors
// and warned of, and neither fails the endpoint nor moves an affinity pin.
//
// SCTP: as TCP, but message by message (each with its stream and payload
// protocol identifier), where the kernel has SCTP.
//
// # Changes
//
// Sync applies servicelb.Diff of the last state and the new one (the sync
// loop is internal/syncer's, shared by every backend): only the listeners
// and endpoint tables of the ports that changed are touched. A listener
// whose address, port and protocol stay is kept, and points at the port's
// new decision at once, even when it passes to another service port; a
// new endpoint set, a new policy, affinity or source range costs no
// socket operation. A connection or session goes on with the endpoint it
// reached: new flows never go to an endpoint no longer selected, while a
// TCP or SCTP connection to an endpoint that stopped serving its port (or
// to a port that went away) runs until it ends, or for
// Options.DrainTimeout when set, and a UDP session to it ends at once
// (the flows servicelb calls stale). Endpoints that still serve (drained
// to weight 0, terminating, deselected by a policy) keep theirs.
//
// Every sync checks in process that every listener still serves; the
// periodic sync (and one at most every minute otherwise) also reads the
// held addresses back, and a listener that failed or an address someone
// removed is restored by writing the whole state again.
//
// # Lifecycle, ownership, privileges
//
//	p, err := userspace.New(userspace.Options{HoldAddresses: true})
//	defer p.Close()
//	rep, err := p.Sync(ctx, state) // as often as the state changes
//	text, err := p.Render(state)   // what it would serve, as text
//	stats := p.Stats()             // connections, bytes, dial errors per port
//	err = p.Cleanup(ctx)           // closes everything, removes its addresses
//
// New starts nothing. The proxy owns its listeners, connections and UDP
// sessions (all in the process: they end with it, so a restart drops the
// connections under way, which no kernel state carries, unless the old
// process hands them over: see Handover below), the addresses on
// Options.Link that carry its mark, and the dummy link it created (which
// carries the mark "kproxy-userspace" as its alias, so that a restarted
// proxy, or another process's Cleanup, knows it as the proxy's). Close
// ends every listener, connection and goroutine and leaves the addresses
// for the next proxy; Cleanup also removes them (and the dummy link it
// created: a link of that name someone else made stays, with their
// addresses); a later Sync serves again. Nothing else in the namespace is
// touched: no routes, sysctls or packet filter rules. The link and its
// addresses are handled by package internal/rtnl, which the ipvs backend
// shares: a sync's adds go in one batch, many requests to a system call,
// with each one's own error, and its deletes in another.
//
// Privileges: none without HoldAddresses (and a NetNS of the caller's
// own); CAP_NET_ADMIN in the target namespace with it, on Linux 5.18 or
// later (address marks); CAP_SYS_ADMIN to enter a namespace other than
// the caller's (Options.NetNS); the sockets are made in it, by a thread
// that stays there. New refuses an option whose capability the process
// lacks, with an error that names it and wraps servicelb.ErrPermission.
//
// # Handover
//
// A new process takes the listening sockets and the TCP connections of
// the old one over a Unix socket (SOCK_SEQPACKET), as Envoy's hot
// restart and systemd's socket passing hand sockets on, so that a restart
// or an upgrade cuts none: the new Proxier is made with Options.TakeOver,
// a connection to the old Proxier's HandOver, and takes its listening
// sockets at New (the old one goes on accepting from them); its first
// Sync serves with them, then takes each connection where neither
// direction holds a byte in the proxy (the bytes in the sockets' buffers
// stay there: nothing is lost or sent twice), and carries it on
// (PortStats.TakenOver). The connections go a few at a time, each
// carried on by the new process before more than a few others stop, so
// that a request under way waits a moment, not the whole handover; a
// connection the old process accepted and is still making to its
// endpoint goes once made. Measured (TestHandOver): of 300 connections held
// through the old process, with 50 new ones a second and four streams
// under way, none was cut and none of the new ones failed, and every
// stream's bytes came back in order; a restart without a handover cut all
// 300. UDP sessions and SCTP connections are not handed over (a UDP
// client's next datagram starts a session in the new process), nor a
// connection that does not go quiet within ten seconds (its receiver
// takes nothing), which is reset.
//
// # Limits
//
// The endpoint sees the proxy's address, never the client's: servicelb's
// masquerade verdicts hold for every flow, and no policy can keep the
// client's address (Capabilities lacks servicelb.FeaturePreserveSource).
// A flow the verdicts drop or reject is reset, for TCP and SCTP, where a
// packet filter answers with an ICMP error or not at all
// (servicelb.FeaturePacketVerdicts). Traffic to an address of
// NodeConfig.ServiceCIDRs that is no cluster IP is routed as the node
// routes it: the proxy holds addresses, not prefixes
// (servicelb.FeatureServiceCIDRs); a port of a held cluster IP that no
// service has is refused by the kernel as any closed port
// (servicelb.FeatureUndefinedPorts, declared with HoldAddresses and no
// Listen: where the proxy does not hold the cluster IPs, such a flow goes
// wherever the node routes it). The origin of
// a flow is told by its source address alone, so a node process that
// sends from an address not in NodeConfig counts as outside. A listener
// holds its port as any socket does (servicelb.FeatureFreePorts): a
// process of the node that binds the wildcard address (0.0.0.0, ::) on a
// port a frontend listens on, such as a host-network server on port 80
// while a cluster IP serves port 80, gets EADDRINUSE, where binding one
// of the node's own addresses succeeds; and a frontend whose port such a
// process bound first is left out (a *ListenError). Every byte
// crosses the proxy: each connection costs two sockets, and a stream
// through it costs the kernel two TCP connections' work.
//
// # Performance
//
// The package's benchmarks (make bench-userspace) measure the proxy
// against a direct connection to the endpoint in the same run, on
// loopback and through network namespaces; see the README for figures.
// Latency, UDP round trips, idle connections and syncs meet their
// targets; a stream meets its own (0.8x a direct one) only with a
// processor to spare. The reason is where the processor time goes. On a
// 1 GiB loopback stream (perf, the client, the proxy and the endpoint in
// one process), the path through the proxy costs 0.41 s of processor time
// per GiB against a direct connection's 0.25 s, all of it in the kernel
// but a few percent:
//
//   - both paths copy each byte twice, into the client's socket and out
//     of the endpoint's (0.17 s per GiB through the proxy, 0.15 s
//     direct): splice(2) moves the bytes through the proxy as page
//     references;
//   - the proxy's second TCP connection costs the rest: its receive of
//     the client's segments (0.06 s more in the client's writes, whose
//     softirq delivers them), the splice calls that move the bytes
//     through a pipe and send them on (0.12 s, the endpoint's receive of
//     them included) and the acknowledgements either way (0.02 s);
//   - Go's scheduler and network poller take 0.015 s.
//
// On a machine whose processors are all busy, a stream gets the processor
// time it competes for, so it cannot run faster than about 0.25/0.41, 0.6
// of a direct stream (0.58-0.62x, medians of runs on two processors under
// a load of 8 to 11). With a processor to spare, the client, the proxy and the
// endpoint run at once and a stream runs at 0.7-0.9x. Capping the buffers
// of near peers (see Copying) saved 7-9% of that processor time: the
// endpoint's read of the bytes had cost twice a direct read (0.12 s per
// GiB), their having left the caches in the several MiB the autotuned
// buffers held.
//
// # Conformance
//
// The conformance kit (package servicelb/conformance) runs on the proxy
// in two setups. Holding the service addresses: on the node's loopback
// over TCP and UDP, and on a dummy link over SCTP (in a VM, whose kernel
// has SCTP and dummy links). Without privileges: the proxy runs as uid
// 65534 with no capability and holds nothing; a frontend on an address the
// node has at a port of 1024 or more (node ports, and external IPs that
// are node addresses) listens where it is, every other one (cluster,
// external and load-balancer IPs; ports below
// net.ipv4.ip_unprivileged_port_start) at the node's address of its family
// and a port of its own (Options.Listen), and the kit asks there from the
// same origins (conformance.Backend.Redirect): the proxy tells the origin
// from the client's address and interface, and applies the verdicts of
// the frontend the listener stands for. In both, a check that wants the
// client's address kept wants the node's (servicelb.FeaturePreserveSource),
// and a TCP or SCTP check that wants an ICMP error, or silence, wants a
// reset (servicelb.FeaturePacketVerdicts). The scenarios that do not
// apply, and why:
//
//   - cluster-ip/unallocated-service-address-dropped: the proxy holds
//     addresses, not prefixes, so a flow to an address of
//     NodeConfig.ServiceCIDRs that no service has is routed as the node
//     routes it, not dropped (servicelb.FeatureServiceCIDRs).
//   - cluster-ip/undefined-port-rejected: the kit asks it of backends with
//     servicelb.FeatureServiceCIDRs. Holding the addresses, the proxy has
//     the kernel refuse a port of a cluster IP that no service has, as any
//     closed port; without privileges no cluster IP is on the node, and
//     such a flow is routed away.
//   - left-out/endpoint-capacity: the proxy has no bound on the endpoints
//     of a port.
//   - scheduler/maglev-spreads-one-clients-connections: the proxy honours
//     the schedulers random, rr and wrr, not mh (Maglev).
//   - node-port/ports-stay-free: the listeners hold their ports, so a
//     server of the node cannot bind the wildcard address on them
//     (servicelb.FeatureFreePorts).
//   - stale-flows/no-serving-endpoint-keeps-its-flows and
//     stale-flows/deleted-service-keeps-its-flows: a port that no endpoint
//     serves has no listener, so its UDP sessions end with its last
//     serving endpoint or with the port (servicelb.FeatureLingeringFlows),
//     where a conntrack translation would run on until it idles out.
//
// # Where each step lives
//
// The files follow the backends' one skeleton (see CONTRIBUTING.md).
// plan.go plans each service port's frontends; write.go opens, claims,
// holds and closes the listeners a change asks for; render.go the text;
// engine.go the engine internal/syncer drives. There is no model.go and
// no verify.go: the applied state is the ports and listeners the Proxier
// serves (route.go, listener.go), and Verify checks the held addresses
// (holder.go); checkflow.go gives the word on one explained flow
// (servicelb.FlowChecker: the frontend's listener and its socket's
// address, the held address, the endpoints the data path picks from). The data path: conn.go and splice.go (TCP and SCTP),
// udp.go and replies.go (UDP), pick.go (the endpoint), budget.go (the
// flow budget), iface.go, sock.go and sctp.go; handover.go the handover.
package userspace
