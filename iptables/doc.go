// Package iptables is a servicelb.Proxier that renders each service
// port's decision (a servicelb.ServicePort: verdicts by origin, endpoint
// sets, source ranges, affinity, hairpin) as kube-proxy's iptables-mode
// rules, written directly through nf_tables netlink in exactly the
// encoding iptables-nft uses: iptables-nft-save, iptables -S, -C and -D
// show and handle them as ordinary iptables rules. No iptables binary
// runs. What a service and its verdicts mean is servicelb's (see its
// package documentation); this package says how they become rules.
//
// # The chains
//
// Each address family gets kube-proxy's layout in its ip (or ip6) nat and
// filter tables, every chain name starting with the chain prefix P
// (Options.ChainPrefix, "KPROXY-" by default; with "KUBE-" the names are
// kube-proxy's). Per service port, named by a 16 character hash of the
// port as kube-proxy hashes it:
//
//   - P-SVC-* spreads new flows over the cluster set, P-SVL-* over the
//     local set: statistic random rules with each endpoint's share of the
//     weight left, printed as kube-proxy prints them, after ClientIP
//     affinity checks (-m recent). P-SEP-* marks a flow from an endpoint
//     of ServicePort.HairpinAddrs to itself for masquerade, records affinity
//     and DNATs to one endpoint.
//   - P-EXT-* takes the flows to the port's external IPs, load-balancer
//     IPs and node ports. P-FW-*, before it for load-balancer IPs with
//     ServicePort.SourceRanges, sends the flows from those prefixes on and
//     marks the others with P-MARK-DROP.
//
// The shared chains: nat PREROUTING and OUTPUT jump to P-SERVICES, which
// matches each port's cluster IP, external IPs and load-balancer IPs,
// and ends with a jump to P-NODEPORTS for each node address that serves
// node ports (NodeConfig.NodePortIPs). In the filter table P-SERVICES
// (from FORWARD and OUTPUT) holds the rejects and drops of cluster IPs,
// P-EXTERNAL-SERVICES (from INPUT, FORWARD and OUTPUT, so that the
// node's own flows meet them too) those of the other frontends,
// P-NODEPORTS accepts health check node ports
// (ServicePort.HealthCheckNodePort), P-PROXY-FIREWALL drops what
// P-MARK-DROP marked (Options.DropBit) and P-FORWARD drops what conntrack
// calls invalid (unless Options.ConntrackTCPLiberal) and accepts forwarded
// service traffic. P-MARK-MASQ sets the masquerade mark
// (NodeConfig.MasqueradeBit) and P-POSTROUTING, from nat POSTROUTING,
// masquerades marked flows with --random-fully.
//
// # Verdicts
//
// Rules tell origins apart as servicelb does: a pod as the node's
// local-traffic detection recognises it (servicelb.NodeConfig.LocalMatch:
// -s CIDR, one rule per prefix of the family, or the input interface, -i
// cbr0 for a bridge, -i veth+ for a name prefix), the node by -m addrtype
// --src-type LOCAL, and the rest (outside) by neither, in that order. The
// node's own flows, which the nat OUTPUT chain sends through the same
// chains, have no input interface: an interface match never takes them
// for a pod's, as in kube-proxy.
// Where every origin of a kind of frontend has one verdict, one rule
// serves them all; otherwise rules for pods, then for the node, come
// first where their verdict differs from the one they would reach, and
// the outside's verdict comes last. A verdict renders as:
//
//   - ToCluster, ToLocal: a jump to P-SVC-* or P-SVL-*. For the cluster
//     IP the jumps are in nat P-SERVICES, and the masquerade rules, which
//     match the cluster IP and port, at the top of the chains jumped to:
//     one rule when every origin is masqueraded, kube-proxy's "! -s CIDR"
//     (or "! -i cbr0", "! -i veth+") when every origin but pods is
//     (P-OFFCLUSTER-MASQ, which returns for each prefix, with several
//     prefixes of the family), none when no origin is, and otherwise
//     rules that set and clear the mark origin by origin. For the other frontends
//     nat P-SERVICES and P-NODEPORTS jump to P-EXT-* (or P-FW-*), which
//     holds the rules by origin, each masqueraded flow marked before its
//     jump: kube-proxy's EXT chains for its verdicts.
//   - Reject: -j REJECT (ICMP or ICMPv6 port unreachable) in the filter
//     table. The nat table leaves the flow untranslated: no rule, or a
//     RETURN ahead of the rules for origins that are forwarded.
//   - Drop: the same with -j DROP.
//
// The filter table sees a flow after nat's DNAT: a forwarded flow is no
// longer addressed to its frontend, so the filter rules of a frontend
// need no match for the origins it forwards. Therefore, in filter
// P-SERVICES after the ports' rules, one rule per service and cluster IP
// rejects what is left of its flows (ports no service has), and the last
// rules drop the rest of the service CIDRs, as
// NodeConfig.DroppedServiceCIDRs lists them. Node port rules match
// the node port alone when it is served on every node port address (the
// filter rules on every local address, -m addrtype --dst-type LOCAL, as
// kube-proxy's), else each node address that serves it.
//
// [Proxier.Render] prints the rules for a State as iptables-save prints
// them.
//
// # Lifecycle
//
// [New] opens a netlink socket in the target namespace (Options.NetNS).
// The first [Proxier.Sync] reads the owned chains back from the kernel and
// writes only what differs, so that a restarted agent takes over without
// touching traffic. Later Syncs use servicelb.Diff: only the chains of
// service ports that changed are rewritten (flushed and refilled, or
// deleted), and their rules in the shared chains (P-SERVICES,
// P-NODEPORTS, P-EXTERNAL-SERVICES) are deleted and inserted one by one,
// by rule handle, in key order; an unchanged State sends nothing. Every
// sync is one nf_tables transaction, built for the ruleset generation it
// read: it applies whole or not at all, and a failed sync leaves the
// previous rules in place. Before each sync a cheap check (the
// generation, then the tables' chain counts and the jumps in builtin
// chains) tells whether someone else removed chains or jumps; at most
// every Options.VerifyInterval, when the generation moved, a deep verify
// reads every owned rule back. Either finding a difference makes the
// Proxier read its chains back and repair them in one transaction. The
// sync loop is internal/syncer's, shared by all the backends.
//
// Other writers of the same tables (iptables, a firewall manager, a CNI
// plugin) keep their chains and rules: the Proxier touches only its own.
// A step of a sync that loses a race with one of them (a dump their
// commit interrupted, a batch refused because the ruleset generation
// moved under it) is retried at once within the same Sync: at most 8
// attempts, with pauses of 1, 2, 4 ... 64 ms between them, 127 ms in all.
// Within each attempt, a repair that reads the tables and writes the
// difference starts over up to 3 times when the generation moves between
// its read and its write, and the dump of one chain is repeated up to 8
// times when a commit interrupts it. Only then does Sync fail, with the
// last error, and the caller's backoff (the Runner's RetryInterval) take
// over; nothing of the failed attempts was applied.
//
// What the kernel refuses is traced to its service: every batch says
// which service port each message is written for (a port's chains and
// their rules, its rules in the shared chains) and which service (its
// cluster IPs' rules in the filter table). When the kernel refuses a
// commit and every message it refused is such a service's, those services
// are left out and the rest applied in the same Sync, whose report names
// them (servicelb.SyncReport.LeftOut: a *servicelb.ValidationError
// wrapping servicelb.ErrRefused and the kernel's error); they stay out,
// untried, until they change. A refused change that looks like drift
// (ENOENT, EEXIST) is first repaired by a whole write, and its services
// are left out only when that fails too. A refusal of anything that is no
// service's (the tables, the builtin and fixed chains, the jumps), or of
// the removal of a service's chains, fails the Sync, which changes
// nothing.
//
// Unless Options.NoConntrackCleanup, each successful Sync deletes the
// conntrack flows that servicelb calls stale: after the first sync and
// every repair, for every UDP and SCTP frontend of the state
// (State.StaleFlows), else for the frontends the sync changed
// (Changes.StaleFlows). Filters whose deletion failed stay queued and the
// next Sync retries them.
//
// The rules of the shared chains are placed by rule handle: the Proxier
// learns the handles of the rules it inserts from the kernel's echo of two
// of them per table, as the kernel hands handles out in batch order.
//
// A sync that writes the whole state (the first, a repair, a node change)
// plans each service port's chains as it encodes them into the batch and
// keeps none of them: what it holds at the peak is the State, the batch
// and the rules of the shared chains. The batch of one transaction goes
// to the kernel in one datagram (the kernel refuses a batch spread over
// several): about 2 KB an endpoint, since each rule carries the 256
// bytes of kube-proxy's comment match (10k services of 10 endpoints make
// a batch of 210 MB).
//
// # What it owns, and Cleanup
//
// The Proxier owns the chains named with its prefix in the shapes above
// (two Proxiers whose prefixes start alike still keep apart) and the rules
// in builtin chains that jump to them. It creates the ip/ip6 nat and
// filter tables and their builtin chains when missing, as iptables-nft
// does, and never flushes or deletes them. [Proxier.Cleanup] removes the
// owned chains and jumps; everything else stays.
//
// # Asking why
//
// [Proxier.CheckFlow] (servicelb.FlowChecker) reads back what serves an
// explained flow in the tables of its family: the node's chains and
// jumps, and the chains of the explained port's service with their rules
// in the dispatch chains, each compared with what the explanation's own
// ServicePort plans. [Proxier.Trace] (servicelb.Tracer) follows the next
// packet of a flow through the owned chains with nf_tables' trace events
// (iptables-nft's tables are nf_tables tables), each rule as
// iptables-save writes it; a table of its own (family inet,
// "kproxy-iptables-trace") marks the first packet of each new flow
// meanwhile.
//
// # Privileges
//
// CAP_NET_ADMIN in the target network namespace (CAP_SYS_ADMIN to open
// sockets in another namespace than the caller's), and the kernel's
// nf_tables with nft_compat and the xt matches and targets used (comment,
// statistic, recent, addrtype, conntrack, mark, tcp/udp/sctp, DNAT,
// MASQUERADE, MARK, REJECT).
//
// # Where each step lives
//
// The files follow the backends' one skeleton (see CONTRIBUTING.md).
// plan.go plans a State's service ports, with node.go (the node's rules
// that belong to no service); model.go holds the tables' content, the
// model of a State; write.go writes a step's changes into a transaction;
// render.go the iptables-save text; engine.go the engine internal/syncer
// drives. There is no verify.go: internal/xtables' Applier keeps the
// content last written and reads the tables back. names.go names the
// chains.
package iptables
