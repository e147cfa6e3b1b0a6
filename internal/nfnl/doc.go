//go:build linux

// Package nfnl writes and reads nf_tables rulesets over netlink, for the
// backends that program nf_tables: the native nftables backend and the
// iptables backend (which writes iptables-nft's encoding).
//
// # Writing: one batch, one transaction
//
// A Batch collects messages: tables, chains (base chains with a Hook, or
// regular ones), rules, sets and maps, and set elements, together with the
// flushes and deletions that replace them. Rules carry expressions of
// github.com/google/nftables/expr, marshalled with expr.Marshal, so any
// expression that library knows fits, native or x_tables (expr.Match,
// expr.Target; set Rule.Compat for the NFTA_RULE_COMPAT attribute that
// nft_compat wants). Rules go at the end of a chain (AddRule), at its start
// (InsertRule), after or before a rule handle (Rule.Position) or a rule
// added earlier in the same batch (Rule.ID and Rule.PositionID), or replace
// a rule by handle (ReplaceRule); DelRule deletes by handle. A rule without
// Exprs is written from Rule.Raw, expressions encoded elsewhere or dumped,
// or from Rule.Encoded, its whole expression list encoded elsewhere (the
// iptables backend's own encoder), in one copy.
//
// Builder methods never fail. A mistake is kept (Batch.Err) and Commit then
// refuses to send anything. Conn.Commit frames the messages between
// BATCH_BEGIN and BATCH_END and sends them in a single datagram: the kernel
// applies all of them or none (it aborts a batch whose end does not come in
// the datagram of its beginning). A batch is built in chunks of a MiB or
// more, never copied whole as it grows, and the datagram is sent from
// those chunks by one sendmsg. Compared with github.com/google/nftables'
// Conn.Flush, no message asks for an echo or an acknowledgement, so the
// kernel answers only for the messages that fail, and the socket's send
// buffer grows to the batch (SO_SNDBUFFORCE), so a batch of tens of
// megabytes goes through in one piece instead of failing with EMSGSIZE.
// Large element lists are split across messages by the batch itself, and
// elements of one set added in several calls fill the same messages.
//
// Batch.Echo marks chosen rule additions for NLM_F_ECHO: the kernel sends
// them back after the commit with their handles, which Batch.Echoed
// returns. The iptables backend asks for two per table and derives the
// other handles, which the kernel hands out one by one in batch order.
//
// After the batch, Commit asks for the ruleset generation (NFT_MSG_GETGEN)
// on the same socket; the kernel's errors for the batch arrive before that
// answer, so Commit knows the outcome without per-message acks. Each
// message is numbered, and a failure is reported as a *CommitError listing
// every failed message with its position, a description such as "add rule
// inet kproxy services" and the errno (errors.Is(err, syscall.ENOENT)
// works), plus the kernel's extended-ack text when it gives one.
//
// # Owners
//
// Batch.SetOwner makes what is added next belong to an owner of the
// caller's choosing, such as the service port a chain, a rule or an
// element is written for. A refused message reports its owner
// (MessageError.Owner); in a message of elements that several owners
// share, the owner of the element the kernel points at in its extended
// acknowledgement. RefusedOwners groups a refusal by owner when every
// refused message has one, so that a caller can leave out what the
// kernel refused and commit the rest. Conn.RefuseRules has the real kernel
// refuse the rules of chosen owners, for tests.
//
// # Generations
//
// Every commit in a namespace, by anyone, moves the ruleset generation on.
// Conn.Generation reads it in one round trip, and Commit returns the
// generation right after its own commit: a caller that remembers it learns
// cheaply whether anyone else has committed since. Batch.RequireGeneration
// makes a batch apply only if the generation is still the one the caller
// read (ErrGenerationChanged otherwise). LostRace tells that error, and a
// dump that a commit interrupted, from the kernel's other refusals: the
// backends' sync engine retries those steps at once. WithRequests counts
// a call's round trips by kind, for tests.
//
// # Reading
//
// Conn.Table, Tables, Chains, Rules, Sets and Elements dump one table's
// objects. Rules come back with their expressions raw (Rule.Raw) and,
// where the expression library knows them all, decoded (Rule.Exprs);
// RulesRaw skips the decoding, for large tables, and EachRule and
// EachElement stream a dump without copying it, for comparing a large table
// with what it should hold. SameExprs compares a dumped rule with
// expressions one would write, independent of attribute order (the library
// cannot read byteorder expressions back; DecodeExpr can), and EncodeExprs
// encodes a rule once for writing it raw into many batches. A dump that raced with a commit fails
// with ErrDumpInterrupted; a missing table or set gives ErrNotExist.
//
// # Namespaces and privileges
//
// Options.NetNS selects the network namespace: the socket is created there
// and stays there. Changing or reading the ruleset needs CAP_NET_ADMIN in
// that namespace; raising the send buffer beyond net.core.wmem_max needs
// CAP_NET_ADMIN too (without it Commit sends as much as the limit allows).
// The package never execs a binary.
package nfnl
