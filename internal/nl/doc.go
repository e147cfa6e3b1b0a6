//go:build linux

// Package nl sends netlink requests many to a sendmsg(2), and tells
// the outcome of each: the machinery under the backends that write
// objects the kernel takes one message at a time and without a
// transaction (IPVS virtual and real servers through generic netlink,
// addresses through rtnetlink), where a request per system call and a
// read of its acknowledgement cost more than the kernel's own work.
//
// # Batches
//
// A Batch collects request messages, each encoded as it is added: a
// header (type and flags; Message adds NLM_F_REQUEST), a fixed part (a
// generic netlink header, an ifaddrmsg) and attributes, nested or not.
// Builder methods never fail. Conn.Send cuts the batch into chunks of whole
// messages of at most Options.ChunkBytes, numbers the messages and writes
// each chunk with one sendmsg. The kernel's netlink_rcv_skb handles every
// message of the datagram in order, in the sender's system call, whatever
// became of the messages before: a failed message does not stop the
// others. Only the last message of a chunk asks for an acknowledgement
// (NLM_F_ACK); the kernel answers the others only when they fail, with an
// NLMSG_ERROR that carries their sequence number. When the last message's
// answer arrives, every earlier answer of the chunk has arrived before
// it, so a chunk costs one sendmsg and one recvmsg, plus one recvmsg per
// failed message, and Send returns the error of each message (nil for
// success). The socket asks for capped acknowledgements (NETLINK_CAP_ACK)
// and extended ones (NETLINK_EXT_ACK): an error carries the failed
// message's header alone and the kernel's explanation when it gives one.
//
// The kernel drops answers that do not fit the socket's receive buffer;
// the buffer is set to Options.ReceiveBuffer (8 MiB by default, with
// CAP_NET_ADMIN beyond the system's limit) and a chunk is bounded, so
// that every message of a chunk may fail and still be told. Should the
// kernel report a lost answer (ENOBUFS), Send fails with ErrLost: the
// caller then knows nothing of that chunk and reads the kernel again.
//
// Nothing here is transactional: a caller that must not take a step
// unless the previous ones succeeded (IPVS's add before delete) sends
// them in separate batches and looks at the errors in between.
//
// # Reading
//
// Conn.Dump sends one request with NLM_F_DUMP and calls a function with
// each message of the answer; Conn.Get sends one request and calls it
// with the kernel's reply. A dump the kernel marks as interrupted by a
// concurrent change (NLM_F_DUMP_INTR) fails with ErrDumpInterrupted after
// it has been read to its end; the caller tries again, as
// RetryInterrupted does.
//
// The package knows no netlink family's objects: ipvsnl encodes IPVS's
// requests into its batches, rtnl route netlink's (links, addresses,
// routes).
//
// # Privileges
//
// None to open a socket in the caller's namespace; CAP_SYS_ADMIN to open
// one in another (Options.NetNS). What a request may change is the
// kernel's business: CAP_NET_ADMIN in the namespace for IPVS and
// addresses.
package nl
