// Package ipvs is kproxy's IPVS dataplane: a servicelb.Proxier in the
// manner of kube-proxy's IPVS mode. It programs IPVS through generic
// netlink (github.com/moby/ipvs), the dummy link through rtnetlink
// (github.com/vishvananda/netlink), its helper sets through the ipset
// package and its helper rules through nf_tables netlink in iptables-nft's
// encoding. It runs no binary of its own (but see Privileges).
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
// with the affinity timeout in whole seconds: IPVS keeps a client's choice
// for that long after the client's last new connection, and as long as
// connections it chose live on.
//
// The virtual addresses that are not node addresses (cluster, external and
// load-balancer IPs) sit on a dummy link, Options.Interface (default
// kproxy-ipvs0), so that the kernel takes their traffic in locally, where
// IPVS sees it. Node addresses stay where they are.
//
// # Ownership
//
// The proxier's virtual servers are those on an address of its dummy link,
// and those its helper sets record: every virtual server on a node address
// or an external address is listed in the sets before it is created and
// unlisted only after it is deleted. Every other virtual server is left
// alone, including foreign ones on node addresses, and a State that needs
// one is refused with ErrConflict. Two proxiers with different links, set
// prefixes and chain prefixes share a namespace, as long as their services
// do not share addresses and ports.
//
// # Helper rules and sets
//
// IPVS only balances. The rest is done by a fixed set of rules in the
// iptables nat and filter tables of both families (chains named
// Options.ChainPrefix + SERVICES, CLUSTER-IP, MARK-MASQ, POSTROUTING, INPUT,
// SOURCE-RANGES, FORWARD, entered from the builtin chains) that match
// ipsets (named Options.SetPrefix + base + "-4" or "-6"):
//
//   - traffic to a cluster IP from outside the cluster CIDRs (all of it
//     with MasqueradeAll), and external traffic under the Cluster policy,
//     is masqueraded; external traffic under the Local policy keeps the
//     client's address;
//   - an endpoint reaching itself through its service (hairpin) is
//     masqueraded;
//   - a load-balancer IP with source ranges drops the traffic of other
//     sources (the node's own addresses are always allowed; a service whose
//     ranges are all of the other family admits only the node);
//   - new connections to a port of a virtual address that no service uses
//     are rejected, even if the node itself listens there;
//   - when a Local traffic policy leaves one kind of traffic without
//     endpoints while the other kind has some, that traffic is dropped.
//
// A service without any endpoint keeps its virtual servers with no real
// server: IPVS itself refuses new connections with ICMP port unreachable,
// which a TCP client sees as a refused connection. The number of rules is
// the same whatever the services; only the sets grow with them. Render
// shows it all as the tools print it.
//
// # Lifecycle
//
// New opens netlink sockets in the target namespace and checks that the
// kernel has IPVS; it changes nothing. The first Sync writes the sysctls
// IPVS needs (net.ipv4.vs.conntrack=1, expire_nodest_conn=1 and
// expire_quiescent_template=1, and arp_ignore=1, arp_announce=2 with
// StrictARP; see LeaveSysctls), creates the helper sets, the helper rules
// and the dummy link, reads the virtual servers already there (a previous
// process's) and converges on the State without touching what is already
// right, so that a restart drops no connection. Later syncs send only what
// servicelb.Diff reports, after a cheap check that the dummy link and the
// rules are still there. IPVS is not transactional: a sync adds addresses,
// set entries, virtual servers and real servers before it removes any, so
// that no virtual address is ever without its servers, and a State the
// proxier cannot apply is refused before anything is sent. If a sync fails
// part way, the next one reads the kernel again and completes the change.
//
// Removing a UDP or SCTP real server deletes it at once, and the conntrack
// flows it leaves stale are deleted (Options.Conntrack, by default a
// conntrack.Client in the namespace; Options.NoConntrackCleanup turns
// this off). A removed TCP real server without
// connections is deleted at once; one with connections is set to weight 0,
// so that it takes no new connection while its open ones go on, and is
// deleted once they have ended (IPVS counts a closed connection until it
// leaves its TIME_WAIT or CLOSE state) or after Options.GracefulTimeout.
// Each Sync checks, and so does Drain, which the caller may run between
// syncs.
//
// Cleanup removes every virtual server the proxier owns, the dummy link
// with its addresses, the helper rules and the helper sets. Close releases
// the sockets and leaves the kernel state for a later Proxier.
//
// # Privileges
//
// CAP_NET_ADMIN in the target namespace (and CAP_SYS_ADMIN to reach a
// namespace other than the caller's). The kernel needs the ip_vs module
// and the scheduler modules (ip_vs_rr and so on) loaded, the dummy module,
// ipset with the hash:ip, hash:ip,port, hash:ip,port,ip and hash:ip,port,net
// types, nf_tables with nft_compat and the xt_set, xt_mark, xt_conntrack,
// xt_comment, MASQUERADE and REJECT extensions, and conntrack. The package
// loads no module; github.com/moby/ipvs, however, runs `modprobe -va ip_vs`
// once per process on first use, and logs through logrus if that fails:
// the one program this package causes to run, outside its control.
//
// Replies of connections that keep the client's address (the Local
// external policy) are routed back through the node, so the namespace must
// forward (net.ipv4.ip_forward, net.ipv6.conf.all.forwarding); the
// proxier leaves that setting alone.
package ipvs
