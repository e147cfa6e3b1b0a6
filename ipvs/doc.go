// Package ipvs is kproxy's IPVS dataplane: a servicelb.Proxier in the
// manner of kube-proxy's IPVS mode. It programs IPVS through generic
// netlink (internal/ipvsnl), the dummy link and its addresses through
// route netlink (internal/rtnl, which the userspace backend shares), both
// in batches of many requests to a system call (internal/nl), its
// helper sets through the ipset package and its helper rules through
// nf_tables netlink in iptables-nft's encoding. It runs no program.
//
// The project's design named github.com/moby/ipvs for IPVS; this package
// no longer uses it. That library sends a request, waits for its
// acknowledgement and reads it back for each virtual and real server, and
// loads the module with modprobe on first use: a cold sync of 10k services
// took as long as ipvsadm -R. Batched requests, whose errors come back by
// sequence number, take 0.31x of that (make bench-ipvs).
//
// What a service means (which endpoints take which flows from which
// origin, masquerade, reject or drop, source ranges, affinity, stale
// flows) is decided by servicelb and documented there: each
// servicelb.ServicePort carries its verdicts, and this package renders
// them. Capabilities says what it renders: every feature but affinity
// expiry (IPVS keeps a pin while its connections live) and node ports on
// localhost, the IPVS schedulers, any protocol and number of endpoints;
// Sync refuses a port beyond them with servicelb's own error.
//
// # Virtual servers
//
// Every frontend of a service port (its cluster IP, external IPs and
// load-balancer IPs with the port, the node addresses serving node ports
// with the node port) is an IPVS virtual server whose real servers are the
// targets of the frontend's verdict for clients outside: the port's
// cluster or local endpoints, or none when that verdict rejects or drops.
// Real servers are reached by masquerading (IPVS NAT), with their weights.
// The scheduler is the port's hint, wrr when empty (round robin in
// proportion to the weights); mh also hashes the client's port (the
// mh-port flag), so that one client's connections spread. ClientIP affinity is IPVS persistence with the affinity's
// seconds. A virtual server without real servers makes IPVS refuse new
// flows with an ICMP port unreachable: the reject verdict.
//
// The virtual addresses that are not node addresses sit on a dummy link,
// Options.Interface (default kproxy-ipvs0), so that the kernel takes their
// traffic in locally, where IPVS sees it. Node addresses stay where they
// are.
//
// # Origins and firewall marks
//
// One virtual server has one set of real servers, but the verdict of a
// frontend may differ by origin (the external Local policy forwards pods'
// and the node's flows to every endpoint, outside clients' only to local
// ones). For each origin whose verdict differs from the outside verdict of
// a frontend, a rule marks that origin's flows to the frontend with the
// port's firewall mark, and an IPVS firewall-mark virtual server of that
// mark (per family) has the verdict's targets as real servers: IPVS looks
// firewall-mark virtual servers up before address ones, by the whole
// packet mark. Marks come from Options.FWMarkMask, one per port and
// target set, chosen from a hash of the port's name, so that a restart
// keeps them; a masqueraded origin's mark also carries the masquerade bit,
// and so has a virtual server of its own. These rules live in two chains
// of the mangle table keyed by port (FROM-POD, FROM-NODE): the only rules
// whose number grows with the services, one per frontend and origin of
// the ports whose verdicts differ by origin. An origin whose differing
// verdict drops its flows gets a drop rule instead of a mark.
//
// Origins are told apart as servicelb says: a pod as the node's
// local-traffic detection recognises it (servicelb.NodeConfig.LocalMatch:
// -s CIDR per prefix, or the input interface, -i cbr0 or -i veth+); in
// the mangle table, other flows the node sends are the node's (with an
// interface detection, all of them: they come in on no interface); in the
// nat table, a local source address is the node.
//
// # Helper rules and sets
//
// The rest is done by a fixed set of rules in the nat, filter and mangle
// tables of both families (chains named Options.ChainPrefix + a base name,
// entered from the builtin chains), which match ipsets named
// Options.SetPrefix + base + "-4" or "-6":
//
//   - mangle PREROUTING and OUTPUT (before routing, NAT and IPVS): flows
//     to an address of the service CIDRs (NodeConfig.DroppedServiceCIDRs)
//     that is not local (no cluster IP) are dropped; the node's flows to
//     a load-balancer frontend from sources outside its source ranges are
//     dropped (IPVS takes the node's flows before the filter table sees
//     them); the origins are marked as above; then flows to a frontend
//     whose outside verdict drops (set drop) are dropped unless marked;
//   - nat: flows are tagged with the node's masquerade mark by origin, as
//     the frontend's verdicts say (sets masq for every origin, masq-pod,
//     masq-node, masq-outside for one), and masqueraded on the way out,
//     as are flows from an endpoint to itself (set loop-back);
//   - filter INPUT: flows arriving at a load-balancer frontend from
//     sources outside its source ranges (sets lb-fw, lb-source-range) are
//     dropped; new flows to a port of a virtual address (set vip) that is
//     not a frontend (set frontends) are rejected, even if the node itself
//     listens there;
//   - filter FORWARD accepts masqueraded and established flows.
//
// Render shows it all as the tools print it.
//
// # Ownership
//
// The proxier's virtual servers are those on an address of its dummy
// link, those its set frontends records (every virtual server on a node
// address or an external address is listed there before it is created
// and unlisted only after it is deleted), and the firewall-mark ones whose
// mark has bits of Options.FWMarkMask. Every other virtual server is left
// alone, including foreign ones on node addresses; a service that needs
// one is left out (a *servicelb.ValidationError wrapping
// servicelb.ErrFrontendTaken and ErrConflict, in servicelb.SyncReport.LeftOut)
// and the rest of the State applied. Two proxiers with different links, set
// prefixes, chain prefixes and mark masks share a namespace, as long as
// their services do not share addresses and ports.
//
// # Lifecycle
//
// New opens netlink sockets in the target namespace and checks that the
// kernel has IPVS; it changes nothing. The first Sync writes the sysctls
// IPVS needs (net.ipv4.vs.conntrack=1, expire_nodest_conn=1 and
// expire_quiescent_template=1, and arp_ignore=1, arp_announce=2 with
// StrictARP; see LeaveSysctls), creates the helper sets and the dummy link,
// reads the virtual servers already there (a previous process's) and
// converges on the State without touching what is already right, so that
// a restart drops no connection. Later syncs send only what servicelb.Diff
// reports, after a cheap check that the dummy link and the rules are still
// there; at most every Options.VerifyInterval a deep verify reads the link
// addresses, virtual and real servers and set entries back and repairs
// whatever differs. The sync loop is internal/syncer's, shared by all
// the backends. IPVS is not transactional: a sync adds addresses, set entries,
// virtual servers, real servers and rules before it removes any, so that
// no virtual address is ever without its servers nor a flow marked for a
// missing one, and a service the proxier cannot apply is left out before
// anything of it is sent. Each of these steps is one batch of requests,
// many to a system call: the kernel handles every request of a batch
// whatever became of the others and answers each failure on its own, so a
// step whose requests depend on the previous step's goes only once that
// step succeeded in full (real servers after their virtual servers, and
// no real server is removed unless every addition of the sync went
// through). A virtual or real server the kernel refuses (an errno, such
// as EINVAL for a real server at a broadcast address of the node) leaves
// its service out: the sync reads the kernel again, removes what it made
// of that service and applies the rest, in the same Sync, whose report
// names it (servicelb.SyncReport.LeftOut: a *servicelb.ValidationError
// wrapping servicelb.ErrRefused and the kernel's error); it stays out,
// untried, until it changes. The services of every refusal in a batch are
// left out at once. A request for a virtual server someone else removed
// meanwhile (ESRCH) is no refusal of its service. If a sync fails part
// way otherwise, the next one reads the kernel again and completes the
// change.
//
// Other writers (ipvsadm, keepalived, iptables, a firewall manager) keep
// their virtual servers, sets, chains and rules. A step of a sync that
// loses a race with one of them (a dump their change interrupted, a batch
// of helper rules refused because the nf_tables generation moved) is
// retried at once within the same Sync: at most 8 attempts, with pauses
// of 1, 2, 4 ... 64 ms between them, 127 ms in all; an interrupted dump
// of the dummy link's addresses, or of virtual or real servers, is
// repeated up to 10 times within each attempt. Only then does Sync fail,
// with the last error, and the caller's backoff (the Runner's
// RetryInterval) take over.
//
// After each sync the conntrack flows servicelb calls stale are deleted
// (servicelb.Changes.StaleFlows after a sync of changes,
// servicelb.State.StaleFlows after one of a whole State: the first, one
// after a failure or a node change), through Options.Conntrack, by default
// a conntrack.Client in the namespace (Options.NoConntrackCleanup turns
// this off); a deletion that fails is tried again by the next Sync. IPVS
// forwards a flow by its own connection table, so a removed real server
// whose flows must go on drains: a TCP one, or a UDP or SCTP one whose
// endpoint still serves the port (servicelb keeps such flows), is set to
// weight 0 while it has connections, so that it takes no new flow while
// its own go on, and is deleted once they have ended (IPVS counts a closed
// connection until it leaves its TIME_WAIT or CLOSE state) or after
// Options.GracefulTimeout. Other removed real servers are deleted at once.
// Each Sync checks the draining ones, and so does Drain, which the caller
// may run between syncs.
//
// Cleanup removes every virtual server the proxier owns, the dummy link
// with its addresses, the helper rules and the helper sets. It deletes
// the link only when the proxier created it (such a link carries the mark
// "kproxy-ipvs" as its alias, so that a later process knows it): from a
// dummy link of that name someone else made, it removes the addresses and
// leaves the link. Close releases the sockets and leaves the kernel state
// for a later Proxier.
//
// # Privileges
//
// CAP_NET_ADMIN in the target namespace. New enters the namespace only
// when it is not the one of the thread that calls it, and that alone needs
// CAP_SYS_ADMIN too; without a capability it needs, New fails with an
// error wrapping servicelb.ErrPermission that names it. Sync writes the
// sysctls the proxier needs (see Options.LeaveSysctls) through /proc/sys,
// and only those whose value differs: where /proc/sys is read-only (in a
// container), set them beforehand on the node (sysctl.d), and Sync only
// reads them. The kernel needs the ip_vs module
// and the scheduler modules (ip_vs_rr and so on) loaded, the dummy module,
// ipset with the hash:ip, hash:ip,port, hash:ip,port,ip and hash:ip,port,net
// types, nf_tables with nft_compat and the xt_set, xt_mark (match and MARK
// target), xt_addrtype, xt_conntrack, xt_comment, MASQUERADE and REJECT
// extensions, and conntrack. The package loads no module and runs no
// program: without the ip_vs module, New fails with ErrIPVSUnavailable.
//
// Replies of flows that keep the client's address are routed back through
// the node, so the namespace must forward (net.ipv4.ip_forward,
// net.ipv6.conf.all.forwarding); the proxier leaves that setting alone.
//
// # Where each step lives
//
// The files follow the backends' one skeleton (see CONTRIBUTING.md).
// plan.go plans each service port's virtual servers, helper rules and
// sets; model.go holds the model (the plan of a whole State), its
// building and the step to the next; write.go the delta a step makes and
// its writes, ordered so that no virtual IP is left without servers;
// verify.go the read back, the adoption of what a previous process wrote
// and the check for foreign servers; checkflow.go the kernel's word on
// one explained flow (servicelb.FlowChecker: its virtual and real
// servers, address, set entries and steering rules); render.go the text (with
// vsformat.go and sections.go, which build on every system); engine.go
// the engine internal/syncer drives. servers.go holds the IPVS objects,
// kernel.go the netlink clients, marks.go, rules.go, sets.go and
// ipsets.go the firewall marks and the helper rules and sets, drain.go
// the draining of removed real servers, sysctl.go the settings.
package ipvs
