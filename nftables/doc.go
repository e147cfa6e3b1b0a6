// Package nftables is a servicelb.Proxier that programs native nftables
// through netlink: one table of family inet (default name "kproxy"), which
// it owns entirely and outside of which it changes nothing.
//
// What a packet to a service meets (which endpoints, masquerade or not,
// reject or drop, for each origin of traffic) is decided by package
// servicelb and written down in its documentation; each
// servicelb.ServicePort carries that decision as verdicts by origin. This
// package only renders them as nf_tables objects, as described below.
//
// # Lifecycle
//
//	p, err := nftables.New(nftables.Options{NetNS: ns, Logger: log})
//	defer p.Close()
//	rep, err := p.Sync(ctx, state) // as often as the state changes
//	text, err := p.Render(state)   // the same table as nft text, for dry runs
//	err = p.Cleanup(ctx)           // deletes the table, and nothing else
//
// New opens a netlink socket in Options.NetNS (and a conntrack socket for
// stale-flow cleanup) and sends nothing. Render (the package function, or
// a Proxier from ForRendering, which renders and opens no socket) needs
// neither. The first Sync writes the whole
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
// A sync's batch requires the ruleset generation to be the one the
// Proxier's own last commit left, so that a change costs one round trip:
// if anyone else committed since, the kernel refuses the batch, and the
// sync reads the table's flags and use count before it sends the batch
// again, then requiring no generation (a commit of theirs in between is
// no different from one just after, which the next sync's check reads),
// so that a writer that commits more often than a check takes cannot
// starve the Proxier: a deleted or dormant table, or a chain or set too
// many or too few, is rewritten whole in one transaction. At most every
// Options.VerifyInterval (and only when the generation moved) a deep
// verify reads every chain, rule, set and element back and rewrites the
// table if anything differs. The sync loop is internal/syncer's, shared by
// all the backends.
//
// Other writers of the ruleset (a firewall manager, a CNI plugin, nft by
// hand) share the namespace's nf_tables with the Proxier; the table stays
// the Proxier's alone. A step of a sync that loses a race with one of
// them (a dump their commit interrupted, a batch refused because the
// ruleset generation moved) is retried at once within the same Sync: at
// most 8 attempts, with pauses of 1, 2, 4 ... 64 ms between them, 127 ms
// in all. Only then does Sync fail, with the last error, and the caller's
// backoff (the Runner's RetryInterval) take over; nothing of the failed
// attempts was applied. A deep verify that keeps losing is put off to the
// next Sync rather than failing this one.
//
// After a successful sync it deletes the stale UDP and SCTP conntrack
// flows (servicelb.StaleFlow) through the Options.Conntrack cleaner,
// unless Options.NoConntrackCleanup: those of the frontends the change
// touched (servicelb.Changes.StaleFlows) after an incremental sync, those
// of every frontend of the state (servicelb.State.StaleFlows) after the
// first sync and after any rewrite, when the flows in conntrack may be
// anyone's. A deletion that fails stays pending and is retried on the
// next Sync, kept up to date with the endpoints that serve its frontend
// by then.
//
// # The table
//
// Packets enter through three base chains of type nat: prerouting and
// output (priority -100) jump to "services", postrouting (100) to
// "masquerading". The "services" chain:
//
//   - drops packets to a load-balancer address from sources outside the
//     port's source ranges (sets firewall4/6 and firewall-allow4/6), for
//     the ports whose external verdicts forward;
//   - dispatches on destination address, protocol and port: a frontend
//     of a port without affinity goes to the chain of its verdicts'
//     shape (below), one rule per shape in use, each matching the set of
//     that shape's frontends; a frontend of a port with affinity goes
//     through the verdict map services4/6 to its port's entry chain
//     (svc4-<ns/name>/<port> for its cluster IP, ext4-... for its node
//     ports, external IPs and load-balancer IPs);
//   - rejects what remains for a cluster IP (set cluster-ips4/6, every
//     cluster IP of the state: a port no service has) and drops what
//     remains for the service CIDRs (set service-cidrs4/6, as
//     NodeConfig.DroppedServiceCIDRs lists them).
//
// A shape is the verdicts of one kind of frontend
// (ServicePort.Internal or External), and its chain and its set of
// frontends are named after them:
// verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq. Every
// port whose frontends have those verdicts shares them, so the table has
// a chain per shape in use, never a chain per port: the kernel walks
// every chain of the namespace on each commit, and a change of a port
// costs the same with 50 or 50,000 ports.
//
// A shape's chain (or an affinity port's entry chain) renders the
// verdicts of its kind of frontend. It tells origins apart as servicelb
// does: a pod as the node's local-traffic detection recognises it
// (servicelb.NodeConfig.LocalMatch), else the node by "fib saddr type
// local", else outside. A pod is matched by its source in the set
// pod-cidrs4/6, which holds the detection's prefixes of the family (the
// cluster CIDRs, or the node's pod CIDRs; empty when it detects by
// interface), or by the interface it came in on: `iifname "cbr0"` for a
// bridge, `iifname "veth*"` for a name prefix. The node's own flows pass
// the output hook with no input interface, so an interface match never
// takes them for a pod's. First, the traffic of the origins whose verdict
// masquerades is marked (jump mark-for-masquerade): all of it with one
// rule when every origin masquerades, "ip saddr != @pod-cidrs4" (or
// `iifname != "cbr0"`) for outside and the node, and so on. Then each
// origin goes to its action: the origins whose action differs from
// outside's are matched first (pods, then the node; pods also when the
// node is matched and their actions differ, since a pod's source may be a
// local address), and outside's action is the fall-through. An action is
// "goto cluster4" or "goto local4" (an affinity port: its own balancing
// chain), "drop", or
// "reject": an ICMP (ICMPv6) port unreachable, for TCP too. A chain that
// forwards ends with drop, so that a flow never leaves untranslated. A
// change of the detection is a node change: every entry chain is
// rewritten.
//
// "masquerading" masquerades marked packets, and hairpin packets: a
// translated flow from an endpoint to itself (set hairpin4/6 holds the
// addresses of ServicePort.HairpinAddrs, every endpoint a verdict may forward
// to).
//
// # Load balancing without per-service sets or chains
//
// The number of named sets does not grow with the number of ports: the
// kernel finds a named set by walking a list. A port's cluster (or local)
// endpoints share a number of buckets: as many as their weights, divided
// by their greatest common divisor, ask for (one each when the weights are
// equal), or, when that would be more than 4095, 4095 shared in
// proportion. Each frontend is in the set of its number of buckets
// (buckets4/cluster-3, buckets4/local-2), and its buckets are elements of
// the hash map endpoints4/6, frontend and bucket to endpoint (a local
// set's buckets from 4096). The balancing chains cluster4 and local4
// (and 6) hold one rule per number of buckets in use:
//
//	ip daddr . meta l4proto . th dport @buckets4/cluster-3 meta l4proto @protocols4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @endpoints4
//
// Which bucket goes to which endpoint is a function of the endpoints
// alone (a fresh sync writes what a run of changes wrote), chosen so that
// a change moves few buckets (buckets.go, bucketOwners): each of an
// endpoint's buckets asks, in rounds, for the first free bucket of a
// sequence of its own drawn from a hash of the endpoint, and a bucket
// asked for twice goes to the one that ranks higher for it. An endpoint
// replaced, added or removed moves about log2 n of n buckets, wherever its
// address sorts (in the order of the addresses it would move every bucket
// between its old place and its new one).
//
// So a change of endpoints is a change of elements: an endpoint replaced
// changes the elements of the few buckets that move; one added adds its
// bucket, moves a few and moves the port's frontends to the set of one
// bucket more, whose rule the balancing chain gains if no port had that
// many. A hash map's commit does not walk the map.
//
// A port with ClientIP affinity is balanced by a chain of its own instead
// (cluster4-<ns/name>/<port>, local4-...): for each endpoint one rule
// that sends a client pinned to it in the dynamic set affinity4/6 (key:
// client address, the port's slot, endpoint) to the endpoint's chain; then one rule
// per endpoint that picks it with probability weight / remaining weight
// (exact weights) and goes to its chain. The endpoint's chain
// (cluster4-.../<i>) pins the client with the service's timeout, or
// refreshes the pin, in one rule, and translates in the next: when the
// set is full (Options.AffinitySize) the update fails and only the pin is
// lost, never the connection. A change of such a port's endpoints rewrites
// its chains.
//
// Everything the Proxier writes lists back with `nft list table` and
// `nft -j list table`, and the text Render gives loads with `nft -f` into
// the same table (the package's tests check both against the real nft).
//
// # What it refuses
//
// Capabilities: every protocol and feature (every local-traffic
// detection among them), the scheduler hints "" and "random" (both
// weighted random), at most 4095 endpoints in the cluster or local set of
// a service port. Sync and Render check the node and every port they plan
// with servicelb.Capabilities.CheckNode and CheckPort and fail before sending
// anything with its error (a *servicelb.ValidationError wrapping
// servicelb.ErrUnsupported or servicelb.ErrCapacity); more than 2^20
// load-balanced sets of one family fail the same way with ErrCapacity.
// New refuses a table name nft could not parse (ErrInvalidOptions).
//
// What the kernel refuses is traced to its service: every batch says
// which service port each message is written for (a port's chains and
// rules) and, in the messages of the shared sets and maps, each element.
// When the kernel refuses a commit and every message it refused is a
// service port's, those services are left out and the rest applied in the
// same Sync, whose report names them (servicelb.SyncReport.LeftOut: a
// *servicelb.ValidationError wrapping servicelb.ErrRefused and the
// kernel's error); they stay out, untried, until they change. A refused
// change that looks like drift (ENOENT, EEXIST) is first repaired by a
// whole write, and its services are left out only when that fails too. A
// refusal of anything that is no port's (the table, the base and fixed
// chains, the sets themselves, the elements ports share) fails the Sync,
// which changes nothing.
//
// # What it owns, what Cleanup removes
//
// The inet table named by Options.Table, with every chain, set and element
// in it. Cleanup deletes that table, its rules first and the rest in a
// second transaction, once every packet that read the rules before the
// first has gone through (an RCU grace period, waited for with
// membarrier(2)), so that no packet reads the rules of before with the
// maps of after (which would reject a flow either state serves).
// The kernel translates a flow by its conntrack entry only while some
// chain of NAT is registered in the namespace: on a node with no other
// (no CNI plugin's, no other proxy's), the flows the table translated
// end with it. Two Proxiers with different tables
// coexist in one namespace; each only reads the other's commits as a reason
// to check its own table. The Proxier never changes routes, addresses,
// sysctls or other tables, and never execs a binary.
//
// # Asking why
//
// CheckFlow (servicelb.FlowChecker) reads back what serves an explained
// flow (servicelb.State.Explain): the node's chains and elements and the
// explained port's chains, rules and elements, each compared with what
// the explanation's own ServicePort plans, so that a rule, element or
// chain missing, changed or in the way is named. Trace
// (servicelb.Tracer) follows the next packet of a flow through the table
// with nf_tables' trace events, each rule named as Render writes it; a
// table of its own ("<table>-trace") marks the first packet of each new
// flow meanwhile.
//
// # Privileges
//
// CAP_NET_ADMIN in the target network namespace (for nf_tables, conntrack,
// and socket buffers large enough for a whole table in one message). The
// kernel needs nf_tables with inet NAT (CONFIG_NFT_NAT), numgen, fib and
// reject, and conntrack netlink for the stale-flow cleanup.
//
// # Where each step lives
//
// The files follow the backends' one skeleton (see CONTRIBUTING.md).
// plan.go plans a State's service ports and the chains they share, with
// verdicts.go (the rules of a shape's or an entry chain) and buckets.go
// (the buckets of a set of endpoints); model.go holds the
// applied model, the step to the next and the table's content; write.go
// the batch that writes a step or replaces the table; verify.go the read
// back; checkflow.go and trace.go the kernel's word on one flow; render.go
// the nft text; engine.go the engine internal/syncer drives. exprs.go, sets.go and names.go encode rules, sets and names.
package nftables
