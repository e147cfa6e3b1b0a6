//go:build linux

// Package xtables writes iptables rules through nf_tables netlink, in
// exactly the encoding iptables-nft 1.8.9 uses, so that iptables-nft-save,
// iptables -S, -C and -D treat them as their own. It is the machinery of
// the iptables dataplane and of the IPVS dataplane's helper rules.
//
// # The model
//
// A [Rule] is an iptables rule: addresses, interfaces and protocol, then
// extension matches ([Comment], [Port], [Statistic], [Recent], [Mark],
// [AddrType], [Conntrack], [Set]) in order, then a target ([Jump], [Goto],
// [Verdict], [DNAT], [Masquerade], [SetMark], [Reject]). A rule renders as
// the line iptables-nft-save prints for it ([Rule.AppendSave],
// [AppendSaveTable]) and encodes into the nf_tables expressions iptables-nft
// writes for it ([EncodeExprs]): native payload, meta, cmp and bitwise
// expressions where iptables-nft uses them, xt match and target
// expressions with the same info blobs elsewhere, a counter before the
// target. Nothing iptables cannot parse back is ever written, since that
// would hide the whole table from iptables-save.
//
// # Applying
//
// An [Applier] owns the user chains its owner's Owns function accepts,
// and the rules in builtin chains that jump to them. It keeps them as its
// owner asks, one nf_tables batch (one transaction) per change:
//
//   - [Applier.Reconcile] reads what the kernel holds (a dump of the owned
//     tables) and makes it match a complete [TableContent] per table,
//     sending only what differs. Run it first, after a failure, and when
//     [Applier.Check] reports a foreign change. Most chains of a large
//     table can be made on demand, group by group (TableContent.Parts),
//     and are encoded as they come: the rules of a whole ruleset are never
//     held beside the batch that writes them.
//   - [Applier.Commit] applies a [Tx] of changes: whole chains rewritten
//     (flushed then filled), chains deleted, keys of keyed chains replaced
//     rule by rule, jumps restored. A keyed chain holds the rules of many
//     owners (service ports, say) under keys in key order; a change to one
//     key deletes its rules by handle and inserts the new ones before the
//     next key that stays, so its cost follows the change. Handles of the
//     rules it inserts are learned from two echoed rules per table: the
//     kernel hands handles out one by one in batch order, so the first
//     gives all the others and the last checks the count (a mismatch makes
//     the next change start with Reconcile).
//   - [Applier.Check] is the cheap test that nobody removed what the
//     Applier wrote: nothing to do when the nf_tables generation is the
//     one of its own last commit; else it compares the tables' chain
//     counts and the jumps in builtin chains.
//   - [Applier.Cleanup] removes the owned chains and jumps.
//
// Every message says whose it is (nfnl.Batch.SetOwner): a whole chain's
// and its rules' are its owner's (TableContent.ChainOwners,
// Tx.SetOwner), a key's rules are the key's owner's
// (TableContent.KeyOwners); the tables, the builtin and keyed chains and
// the jumps are no one's. A refusal of the kernel names the owners of the
// messages it refused.
//
// Every batch carries the generation it was built for, so that a
// concurrent change by someone else makes the kernel refuse it
// ([ErrGenChanged]) instead of applying a stale diff. Tables and builtin
// chains are created when missing, as iptables-nft does, and are never
// flushed or deleted.
//
// The Applier talks to the kernel through a [Conn], normally an
// *nfnl.Conn opened in the target network namespace; writing and reading
// need CAP_NET_ADMIN there.
//
// # Reuse
//
// The iptables dataplane owns kube-proxy's iptables-mode chains with it;
// the IPVS dataplane owns its helper chains (matching ipsets with [Set],
// marking flows for masquerade and for IPVS firewall-mark services, ...)
// with another Applier and another ownership test in the same tables.
//
// The tables are [Filter], [NAT] and [Mangle], in either family. An
// Applier creates a missing table's builtin chains as iptables-nft does
// ([BaseChains]): mangle's OUTPUT is a route chain, so that a packet whose
// mark it changes is routed again.
package xtables
