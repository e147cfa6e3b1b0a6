// Package ipvs is kproxy's IPVS dataplane: a servicelb.Proxier in the
// manner of kube-proxy's IPVS mode, programming the kernel through generic
// netlink (github.com/moby/ipvs) and rtnetlink
// (github.com/vishvananda/netlink). It runs no binary.
//
// # The model
//
// Every service port of a servicelb.State becomes IPVS virtual servers,
// one per virtual address, protocol and port:
//
//   - its cluster IP and port, with the real servers the internal traffic
//     policy selects;
//   - each external IP and load-balancer IP with the port, and each node
//     address that serves node ports (NodeConfig.NodePortAddresses) with the
//     node port, with the real servers the external traffic policy selects.
//
// Real servers are the selected endpoints, reached by masquerading (IPVS
// NAT), with their weights. The scheduler is the service's hint (rr, wrr,
// lc, wlc, sh, dh, sed, nq, mh; rr when empty); the "random" hint is
// refused with ErrUnsupported. ClientIP affinity becomes IPVS persistence
// with the affinity timeout.
//
// Every virtual address sits on a dummy link (Options.Interface, default
// kproxy-ipvs0), node addresses included, so that the kernel delivers the
// traffic locally where IPVS takes it, and so that ownership is plain: the
// virtual servers whose address sits on the link are the proxier's, and no
// others. Two proxiers with different links coexist in one namespace as
// long as their services do not share node ports.
//
// A virtual server without real servers rejects new connections (IPVS
// answers ICMP port unreachable, which a TCP client sees as a refused
// connection). When a Local traffic policy leaves one kind of traffic
// without endpoints while the other kind has some, that traffic is dropped
// instead, by a helper rule.
//
// # Helper rules and sets
//
// IPVS only balances; masquerading, hairpin, source ranges and the drop and
// reject cases are helper rules in iptables' nat and filter tables (in
// iptables-nft's encoding, as the iptables package writes them) that match
// ipsets. The rules are the same whatever the services: only the sets'
// entries grow with them. Render shows both.
//
// # Lifecycle
//
// New opens netlink sockets in the target namespace and checks that the
// kernel has IPVS; it changes nothing. The first Sync writes the sysctls
// IPVS needs (net.ipv4.vs.conntrack, expire_nodest_conn,
// expire_quiescent_template; arp_ignore and arp_announce with StrictARP),
// creates the dummy link, reads the virtual servers already on it (those a
// previous process left) and converges on the State without touching what
// is already right, so a restart drops no connection. Later syncs send only
// what servicelb.Diff reports. IPVS is not transactional: a sync adds
// before it removes, so that no virtual address is ever without its
// servers, and a State the proxier cannot apply is refused before anything
// is sent. If a sync fails part way, the next one reads the kernel again.
//
// Removing a UDP or SCTP real server deletes it at once and hands the
// flows it leaves stale to Options.FlowCleaner (the conntrack package). A
// removed TCP real server without connections is deleted at once; one with
// connections is set to weight 0, so that it takes no new connection while
// its open ones go on, and is deleted when they end or after
// Options.GracefulTimeout: each Sync checks, and so does Drain, which the
// caller may run between syncs.
//
// Cleanup removes every virtual server on the dummy link's addresses, the
// dummy link with its addresses, and the helper sets and rules. Close
// releases the sockets and leaves the kernel state for a later Proxier.
//
// # Privileges
//
// CAP_NET_ADMIN in the target namespace (and CAP_SYS_ADMIN to reach a
// namespace other than the caller's). The kernel needs the ip_vs module and
// the schedulers' ip_vs_* modules loaded, the dummy module, and ipset and
// nf_tables with nft_compat for the helper rules. github.com/moby/ipvs runs
// `modprobe -va ip_vs` once per process when first used and logs through
// logrus if that fails: the one program this package causes to run, outside
// its control.
//
// Replies of connections that keep the client's address (Local external
// policy) are routed back through the node: the namespace must forward
// (net.ipv4.ip_forward, net.ipv6.conf.all.forwarding), which the proxier
// does not change.
package ipvs
