// Package iptables is a servicelb.Proxier that installs kube-proxy's
// iptables-mode rules, written directly through nf_tables netlink in
// exactly the encoding iptables-nft uses: iptables-nft-save, iptables -S,
// -C and -D show and handle them as ordinary iptables rules. No iptables
// binary runs.
//
// # The rules
//
// Each address family gets kube-proxy's layout in its ip (or ip6) nat and
// filter tables, every chain name starting with the chain prefix P
// (Options.ChainPrefix, "KPROXY-" by default; with "KUBE-" the names are
// kube-proxy's):
//
//   - nat PREROUTING and OUTPUT jump to P-SERVICES, which matches each
//     service port's cluster IP, external IPs and load-balancer IPs and
//     jumps to its chains; its last rules send traffic to the node's
//     addresses that serve node ports (NodeConfig.NodePortIPs: the node
//     IPs NodePortAddresses selects) to P-NODEPORTS, which matches node
//     ports.
//   - Per service port, named by a 16 character hash of the port as
//     kube-proxy hashes it: P-SVC-* spreads new flows over the endpoints
//     (statistic random rules with each endpoint's share of the weight
//     left, printed as kube-proxy prints them), checking ClientIP affinity
//     first with -m recent; P-SVL-* does the same over local endpoints for
//     the Local traffic policies; P-EXT-* handles external traffic
//     (masquerade under Cluster; under Local, pods and the node itself
//     take the Cluster path and others keep their address); P-FW-* admits
//     load-balancer traffic from the source ranges and the node's own
//     addresses and marks the rest with P-MARK-DROP; P-SEP-* masquerades
//     hairpin traffic, records affinity and DNATs to one endpoint.
//   - P-MARK-MASQ sets the masquerade mark (NodeConfig.MasqueradeBit,
//     0x4000 by default) and P-POSTROUTING, from nat POSTROUTING,
//     masquerades marked traffic with --random-fully.
//   - In the filter table, P-SERVICES rejects traffic to cluster IPs of
//     ports without endpoints, drops it when the Local internal policy
//     leaves none, and drops traffic to the service CIDRs that matched no
//     port; P-EXTERNAL-SERVICES does the same for external IPs,
//     load-balancer IPs and node ports; P-NODEPORTS accepts health check
//     node ports; P-PROXY-FIREWALL drops what P-MARK-DROP marked
//     (Options.DropBit, 0x8000 by default); P-FORWARD accepts forwarded
//     service traffic.
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
// previous rules in place. Before each sync a cheap check (the generation,
// then the tables' chain counts and the jumps in builtin chains) tells
// whether someone else removed chains or jumps; if so the Proxier reads
// its chains back and repairs them. Unless Options.NoConntrackCleanup, the
// conntrack flows a sync leaves stale (UDP and SCTP flows to endpoints
// that went away, or to ports that had none) are deleted after it, through
// the conntrack package.
//
// The rules of the shared chains are placed by rule handle: the Proxier
// learns the handles of the rules it inserts from the kernel's echo of two
// of them per table, as the kernel hands handles out in batch order.
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
// # Privileges
//
// CAP_NET_ADMIN in the target network namespace (CAP_SYS_ADMIN to open
// sockets in another namespace than the caller's), and the kernel's
// nf_tables with nft_compat and the xt matches and targets used (comment,
// statistic, recent, addrtype, conntrack, mark, tcp/udp/sctp, DNAT,
// MASQUERADE, MARK, REJECT).
package iptables
