// Package ebpf is a servicelb.Proxier that balances at the socket layer:
// BPF programs on a cgroup's connect, sendmsg, recvmsg and getpeername
// hooks (IPv4 and IPv6) rewrite a socket's destination from a service's
// address to an endpoint's once, when it connects (or, for an unconnected
// UDP socket, on each send), so that the connection then runs as a direct
// one: no translation per packet, no conntrack entry, the client's own
// address kept. It covers the sockets of the processes in the cgroup
// given (Options.Cgroup) and below, from whatever network namespace:
// the node's own processes, and pods whose cgroups lie under it. Traffic
// that arrives from other hosts never meets a socket hook: the packet
// path serves it (Options.Packets, the nftables backend), and the two
// together serve every service as servicelb decides it.
//
// It is written in Go alone: the programs are built with cilium/ebpf's asm
// package when New runs, so the library needs no C compiler to build or to
// run.
//
// # The maps
//
// What a packet to a service meets is decided by package servicelb; this
// package renders each servicelb.ServicePort's verdicts into BPF maps
// (list them with Dump, or Render a State; `bpftool map dump` shows the
// same entries, undecoded):
//
//   - kp_frontends (hash): a frontend (address, IPv4 as IPv4-mapped IPv6
//     so that dual-stack sockets find it too, port, protocol) to what
//     happens to the flows of the node's own sockets and of the sockets
//     of other network namespaces (pods): forward to a set, reject, drop,
//     or pass (below). Cluster IPs, external IPs, load-balancer IPs and
//     the node ports on each node address (NodeIPs) have entries.
//   - kp_sets (hash): a set of endpoints (a port's cluster or local set)
//     to its number of slots and its ClientIP affinity timeout.
//   - kp_slots (hash): (set, slot) to an endpoint. An endpoint holds as
//     many slots as its weight asks for (weights over their greatest
//     common divisor, scaled to at most MaxEndpoints slots); a new flow
//     takes a random slot, or for UDP one chosen by its socket.
//   - kp_members (hash): which endpoints a set of a port with affinity,
//     or of a UDP port, holds; kp_affinity (LRU): a client's pin, keyed by its network
//     namespace (the node's processes are one client, each pod one) and
//     the set, with the time of its last flow: a pin older than the
//     timeout, or to an endpoint the set no longer holds, is replaced.
//   - kp_revnat (LRU): (socket, endpoint) to the service's address, which
//     recvmsg and getpeername show instead of the endpoint's while the
//     frontend exists.
//   - kp_udpflows (LRU, of Sizes.Reverse entries): (socket, set) to the
//     endpoint an unconnected UDP socket's datagrams go to, so that its
//     flow keeps its endpoint while the set holds it, whatever else the
//     set gains or loses, as a conntrack translation does, and moves to
//     another only once it leaves. (An endpoint that still serves but is
//     no longer selected, as a terminating one while ready ones exist,
//     has left the set: the flow moves, where conntrack would keep it.)
//   - kp_config: the node network namespace's cookie (Options.NetNS),
//     which tells the node's sockets from pods'; kp_names: each set's name
//     (service port and role), for Dump and for a restarted process.
//
// # Which flows the sockets take
//
// For each frontend and origin the hooks give servicelb's verdict where a
// socket can give it exactly, and pass the flow on (leave its destination
// alone, for the packet path) where it cannot:
//
//   - reject and drop, with Options.Packets: pass, and the packet path
//     gives them as kube-proxy's rules do: an ICMP port unreachable for a
//     reject, silence for a drop (a pod's connect retransmits and times
//     out; the node's own flow fails its send with EPERM, as any flow the
//     node drops on its way out does). Alone, the hooks give them at the
//     socket, the only way they have: the connect (TCP, or UDP connect)
//     or the unconnected UDP send fails at once with ECONNREFUSED
//     (bpf_set_retval) for a reject, EPERM for a drop, and nothing is
//     sent; the Proxier alone declares no servicelb.FeaturePacketVerdicts.
//   - forward, unmasqueraded, from a pod: the pod connects to the
//     endpoint with its own address, as servicelb decides.
//   - forward, masqueraded, from the node: the node connects to the
//     endpoint from its address on the way there, which is the address
//     masquerade gives (for a socket bound to another address of the
//     node, that address).
//   - pass: a pod's flow servicelb masquerades (node ports, external and
//     load-balancer IPs under the Cluster policy; cluster IPs with
//     MasqueradeAll), a node's flow it does not (cluster IPs on a node
//     without cluster CIDRs: the source would differ), flows to
//     load-balancer IPs with source ranges, SCTP, and everything no
//     frontend names (a cluster IP's other ports, addresses of the
//     service CIDRs): the packet path gives them their verdict.
//
// A pod's flow to itself through a service (hairpin) stays inside the pod:
// no masquerade is needed for the reply to find its way, and the endpoint
// sees its own address. Without Options.Packets, passed flows leave
// untranslated: the pairing is the configuration that serves every
// service.
//
// # Lifecycle
//
//	nft, err := nftables.New(nftables.Options{NetNS: ns})
//	p, err := ebpf.New(ebpf.Options{Cgroup: "/sys/fs/cgroup/kubepods",
//		PinPath: "/sys/fs/bpf/kproxy", NetNS: ns, Packets: nft})
//	defer p.Close()
//	rep, err := p.Sync(ctx, state) // both halves, as often as the state changes
//	text, err := p.Render(state)   // the maps as text, then the nft table
//	err = p.Cleanup(ctx)           // detach, unpin; the nft table too
//
// New checks the kernel (Probe: a wrapped *FeatureError naming what is
// missing, before anything is attached), creates the maps or opens those
// pinned under Options.PinPath, and loads the programs. Maps are pinned
// in a directory named after their layout (a layout version raised with
// every change of an entry's meaning, and the maps' sizes, which
// Options.Sizes sets), so an upgrade to another layout never adopts maps
// it would misread: New makes its own beside the earlier ones, the first
// Sync fills them and swaps its programs into the pinned links
// atomically (BPF_LINK_UPDATE), and only then removes the earlier maps'
// pins: the hooks balance every socket throughout. The hooks' own
// entries (affinity pins, reverse translations) start empty in the new
// maps. A map pinned in the layout's own directory that New cannot read
// (someone else's) is a *PinError (ErrPinIncompatible) naming the pin and
// the way out, RemovePins, and New leaves it as it is. An adopted link is
// updated only when it attaches to the Proxier's cgroup at its hook's
// attach point.
//
// The first Sync (run by internal/syncer's Engine, as for every backend)
// reads the maps, adopts the sets it finds there by name with their
// slots, writes what differs (in batches of 4096 entries, one syscall
// each: a cold sync of 10k services of 10 endpoints is 35 syscalls), and
// only then attaches the hooks through bpf_link, pinning the links; links
// pinned by an earlier process are given the new programs in place
// (BPF_LINK_UPDATE), so a restarted agent never leaves a socket
// unbalanced. Later syncs write only what the changed service ports need
// (servicelb.Diff), each change ordered so that a lookup never meets half
// of it: an endpoint's membership before its slots, slots before the count
// that reaches them and after the count that no longer does, a set before
// a frontend that names it, a frontend before the set it left. The
// writes are found port by port, from the port's plans before and after
// (slots compared by index), without building the maps' content; they
// are exactly what differs between the whole contents (a test checks it
// on random walks), so a frontend one port gives up and another takes as
// it was is not written at all.
//
// One endpoint added to a set is two map writes (its slot, then the
// set's count), one removed two or three (the endpoint in the last slot
// moves into its slot, then the count, then the last slot goes), one
// replaced one (the new endpoint takes the old one's slot); with ClientIP
// affinity, an endpoint's membership of the set is one more write for
// one added or removed, two more for one replaced. An endpoint in both a
// port's cluster and local sets costs that in each.
//
// A sync that changes something sends its map writes and nothing else:
// writes are right whatever someone did to the hooks or pins, and there
// is no cheap way to look at eight hooks (a syscall each). Every sync of
// an unchanged state (a caller's periodic sync), and at most every
// Options.VerifyInterval a sync that changes something, checks in depth:
// that the hooks are attached to the cgroup, that the maps and links are
// pinned, and reads the maps back; any difference makes it write the
// whole content again. So a hook someone detached, a pin or an entry
// someone removed, is put back by the next periodic sync. Paired with a
// packet path (Options.Packets), a detached hook costs speed until then,
// not service: the packet path translates the node's flows too.
//
// Close releases the file descriptors: with a PinPath the hooks and maps
// stay for the next process; without, the hooks are detached. Cleanup
// detaches the hooks and removes the pins (and the PinPath directory when
// it is empty), and nothing else. RemovePins does the same for pins a
// process that holds no Proxier finds, such as an agent's
// clean-up-and-exit mode: it needs no cgroup and loads nothing.
//
// # What it refuses
//
// Capabilities: alone, TCP and UDP, the scheduler hints "" and "random",
// affinity (with its timeout), weights, the client's own address, at most
// MaxEndpoints endpoints per set; services with source ranges, SCTP ports
// or other hints are refused (servicelb.ErrUnsupported). With
// Options.Packets, what both halves can: the packet path's protocols and
// features (traffic from outside, source ranges, the service CIDRs, the
// undefined ports of cluster IPs), the hints both honour, the smaller
// bound.
//
// # What it owns
//
// The eight hooks it attaches to Options.Cgroup (several Proxiers may
// attach to one cgroup: each program runs, and a socket another one has
// already sent to an endpoint meets no frontend in the next), its maps,
// and under Options.PinPath the pins named after them ("link_<hook>", and
// "maps-<layout>/kp_*"; an earlier version's "kp_*" in PinPath itself).
// Of other processes' sockets it connects again only the connected UDP
// sockets its hooks sent to an endpoint that stopped serving (Limits,
// below). It
// never changes routes, addresses, sysctls, firewall rules or other
// programs.
//
// # Privileges
//
// CAP_BPF and CAP_NET_ADMIN, and CAP_SYS_PTRACE to take a socket to
// connect again from another process's descriptors (pidfd_getfd), with
// the processes of the cgroup in sight (the host's PID namespace). It
// never enters another network namespace: no CAP_SYS_ADMIN. The
// kernel needs cgroup v2, BPF_PROG_TYPE_CGROUP_SOCK_ADDR with the
// getpeername hooks (5.8), bpf_get_netns_cookie (5.7), bpf_set_retval
// (5.18), SO_NETNS_COOKIE (5.14), batched map operations (5.6) and
// pidfd_getfd (5.6); a bpf filesystem for pins. Debian 12's 6.1 kernel has all of them.
//
// # Limits
//
//   - Only sockets in the cgroup are balanced. Processes elsewhere, and
//     every host outside, reach services through the packet path.
//   - A connected UDP socket the hooks sent to an endpoint has no
//     conntrack entry to delete when the endpoint stops serving its
//     frontend while others serve it (servicelb.StaleFlow, where
//     kube-proxy deletes the flow's entry and the client's next datagram
//     is translated afresh): after such a Sync, the socket is connected
//     again to its frontend through the hooks, from a descriptor of it
//     taken with pidfd_getfd, as if its owner had connected it again: its
//     next datagram goes to a serving endpoint, and its owner sees no
//     error. Where the hooks refuse the frontend to that socket (no
//     endpoint serves it for the socket's origin, as under the internal
//     Local policy with none on the node), it is disconnected instead:
//     its owner's next send fails with EDESTADDRREQ, rather than reaching
//     the endpoint that left. The sockets are found through the reverse
//     translations (kp_revnat) and the descriptors of the cgroup's
//     processes, in whatever network namespace they were made, without
//     entering it; a reverse translation the LRU map has evicted leaves
//     its socket alone.
//   - A new socket is translated afresh, and so is a datagram of an
//     unconnected one whose flow's endpoint left: a flow does not run on to its endpoint once its
//     service has no serving endpoint or goes away, as a conntrack
//     translation does (servicelb.FeatureLingeringFlows; the conformance
//     kit's stale-flows/no-serving-endpoint-keeps-its-flows and
//     stale-flows/deleted-service-keeps-its-flows do not apply).
//   - A socket in another network namespace is a pod's
//     (servicelb.FromPod) under the default local-traffic detection, by
//     cluster CIDR, whose premise is that pods take their addresses from
//     the cluster CIDRs. The other modes tell pods by the node's pod CIDR
//     or by the interface a packet comes in on, which a socket does not
//     show: under them the hooks give a pod's socket its verdict only
//     where the pod and outside verdicts agree, and leave the rest to the
//     packet path, which tells them apart (servicelb's
//     NodeConfig.PodsByNamespace).
//   - Affinity pins are per network namespace and per set: the node's
//     processes share one pin; a client's pins through the socket hooks
//     and through the packet path are kept apart.
//
// # The tc and XDP path
//
// Cilium serves traffic from other hosts with programs on the interfaces'
// tc (or XDP) hooks, which translate every packet: a node port's packet
// is rewritten to an endpoint's address on the way in, and its replies
// back on the way out. That needs state per flow, which the socket hooks
// do not: a table of the translations made (Cilium keeps its own
// conntrack and NAT maps), source-port allocation for the SNAT of the
// Cluster policy (or DSR), ICMP errors generated for rejects, and care
// with fragments, MTU and checksums; without it, a direct flow to an
// endpoint meets a translation meant for another, and a flow that reuses
// a tuple in TIME_WAIT clashes. A later step here could translate in tc
// and keep the flows in the kernel's own conntrack through its kfuncs
// (bpf_skb_ct_lookup, bpf_skb_ct_alloc, bpf_ct_set_nat_info,
// bpf_ct_insert_entry; present on Linux 6.0 and later), so that conntrack
// keeps doing what it does for the nftables backend; until then, the
// nftables backend is this package's packet path.
//
// # Where each step lives
//
// The files follow the backends' one skeleton (see CONTRIBUTING.md).
// plan.go plans each service port's frontends and endpoint sets; model.go
// holds the model and the maps' content; write.go the delta from one
// content to the next and its writes to the maps (maps.go); verify.go
// checks that the hooks are attached and the maps pinned; checkflow.go
// the kernel's word on one explained flow (servicelb.FlowChecker: the
// frontend's entry, its sets and slots, and the packet path's word); render.go the
// text; engine.go the engine internal/syncer drives. programs.go holds
// the BPF programs, layout.go the maps' layout and its version, pins.go
// and attached.go the pins and the hooks, sockets.go the ending of stale
// sockets.
package ebpf
