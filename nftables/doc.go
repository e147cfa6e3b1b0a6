// Package nftables is a servicelb.Proxier that programs native nftables
// through netlink: one table of family inet (default name "kproxy"), which
// it owns entirely and outside of which it changes nothing.
//
// # Lifecycle
//
//	p, err := nftables.New(nftables.Options{NetNS: ns, Logger: log})
//	defer p.Close()
//	err = p.Sync(ctx, state)   // as often as the state changes
//	text, err := p.Render(state) // the same table as nft text, for dry runs
//	err = p.Cleanup(ctx)       // deletes the table, and nothing else
//
// New opens a netlink socket in Options.NetNS (and a conntrack socket for
// stale-flow cleanup) and sends nothing. The first Sync writes the whole
// table in one transaction; if a table of that name exists (left by an
// earlier process), it is adopted: its rules are flushed, its sets emptied
// and re-filled, chains and sets it should not have are deleted, all in the
// same transaction and without deleting the table, so established
// connections (whose translations live in conntrack) keep flowing. The
// affinity pins survive.
//
// Later syncs compare the new State with the last one applied
// (servicelb.Diff) and send only what the changed service ports need, in
// one transaction: a failed sync leaves the previous table whole, and the
// next sync retries the whole difference. An unchanged State sends nothing.
// Before each sync the Proxier reads the ruleset generation (one small
// round trip); if anyone else committed since its own last commit, it
// reads its table back and compares it with what it wrote (about 0.3 s for
// ten thousand services), and rewrites the table (in one transaction) if
// someone flushed, deleted or changed it.
// After a successful sync it deletes the UDP and SCTP conntrack flows that
// the change left stale (servicelb.Changes.StaleFlows) through package
// conntrack, unless Options.NoConntrackCleanup; deletions that fail are
// retried on the next Sync. The first sync of a Proxier deletes none: it
// cannot tell a stale flow from one the previous process set up.
//
// # The table
//
// Packets enter through three base chains of type nat: prerouting and
// output (priority -100) jump to "services", postrouting (100) to
// "masquerading". The "services" chain:
//
//   - drops packets to a load-balancer address from outside its source
//     ranges (sets firewall4/6 and firewall-allow4/6; the node's addresses
//     are always allowed);
//   - rejects packets to service ports without any endpoint (set
//     no-endpoints4/6): TCP with a reset, the rest with ICMP port
//     unreachable;
//   - dispatches on destination address, protocol and port through the
//     verdict maps services4/6 to the service port's chain: svc4-<ns/name>/
//     <port> for its cluster IP, ext4-... for its node ports (on
//     NodeConfig's node addresses), external IPs and load-balancer IPs;
//   - drops packets to NodeConfig.ServiceCIDRs that matched no service port.
//
// svc chains mark traffic from outside the cluster CIDRs (or all traffic,
// with MasqueradeAll) for masquerade and balance it over the endpoints of
// the internal traffic policy: the cluster-wide ones or this node's. ext
// chains mark for masquerade under the Cluster policy; under Local they
// keep the client's address and use the local endpoints, except for
// traffic from pods and from the node itself, which takes the cluster-wide
// endpoints (masqueraded when from the node). Each chain ends with drop: a
// policy that leaves its traffic no endpoint drops it, since another node
// may serve it. "masquerading"
// masquerades marked packets, and hairpin packets (an endpoint reaching
// itself through its service: set hairpin4/6 holds the addresses of the
// local endpoints, which reach their services through this node, or of all
// endpoints when NodeConfig has no node name).
//
// # Load balancing without per-service sets
//
// The number of named sets is constant: the kernel finds a named set by
// walking a list, and binds every rule that reads a map to it, walking
// those bindings on each element it adds. Each set of endpoints a port
// balances over (cluster-wide, local) owns a slot of 4096 keys in one of
// 256 interval maps per family (backends4-NN, chosen by slot), and the
// rule that balances reads
//
//	meta l4proto tcp dnat ip to numgen random mod 4095 offset <slot*4096> map @backends4-NN
//
// where each endpoint holds a range of buckets sized by its weight. So an
// endpoint change is a change of map elements only: no rule changes, and
// the kernel skips the validation of the whole table that any rule change
// costs. (The kernel's cost of committing set elements still grows with
// the rules loaded in the namespace, in any table: about 20 µs with a
// thousand services and 100 µs with ten thousand on the benchmarks'
// machine. What the Proxier adds to it does not grow.) Weights are honoured to 1/4095 of a port's traffic; a port takes
// at most 4095 endpoints, and a family at most 2^20 load-balancing chains
// (ErrCapacity). Slots are derived from a hash of the service port's name,
// so a restarted Proxier reuses the same ones.
//
// A port with ClientIP affinity is balanced by a chain of its own instead
// (cluster4-<ns/name>/<port>, local4-...): for each endpoint one rule that
// finds the client pinned to it in the dynamic set affinity4/6 (key: client
// address, slot, endpoint), refreshes the pin and translates; then one rule per endpoint that picks it with probability
// weight / remaining weight (exact weights) and pins the client, with the
// service's timeout. A change of such a service's endpoints rewrites its
// chain, which makes the kernel re-validate the table on commit: a cost that
// grows with the table, as for any service added or removed (about 8 ms at
// ten thousand services on the machine the benchmarks ran on).
//
// Everything the Proxier writes lists back with `nft list table` and
// `nft -j list table`, and the text Render gives loads with `nft -f` into
// the same table (the package's tests check both against the real nft).
//
// # What it refuses
//
// Sync fails before sending anything, with a typed error, for: a scheduler
// hint other than "" and "random" (ErrUnsupported), more than 4095
// endpoints for one service port or more than 2^20 load-balanced ports of a
// family (ErrCapacity). New refuses a table name nft could not parse
// (ErrInvalidOptions).
//
// # What it owns, what Cleanup removes
//
// The inet table named by Options.Table, with every chain, set and element
// in it. Cleanup deletes that table. Two Proxiers with different tables
// coexist in one namespace; each only reads the other's commits as a reason
// to check its own table. The Proxier never changes routes, addresses,
// sysctls or other tables, and never execs a binary.
//
// # Privileges
//
// CAP_NET_ADMIN in the target network namespace (for nf_tables, conntrack,
// and socket buffers large enough for a whole table in one message). The
// kernel needs nf_tables with inet NAT (CONFIG_NFT_NAT), numgen, fib and
// reject, and conntrack netlink for the stale-flow cleanup.
package nftables
