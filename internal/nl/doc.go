// Package nl is kproxy's one netlink layer: the framing of messages and
// attributes, the decoding of acknowledgements (extended ones included),
// the reading of dumps, and the batching of requests, under every family
// the project speaks (nf_tables through internal/nfnl, route netlink
// through internal/rtnl, IPVS's generic netlink through internal/ipvsnl,
// ipset, conntrack and socket diagnostics). Headers and attribute headers
// are in the host's byte order, as the kernel reads them; values are in
// the order each family wants, which its encoder chooses.
//
// # Framing
//
// AppendHeader, AppendAttrHeader, AppendNest and EndNest, Pad and Align
// write what every message is made of; Split cuts a datagram into
// Messages, a Decoder (or Attrs) reads attributes, ParseAck an
// acknowledgement or refusal: an *Error with the errno, the kernel's
// explanation and the offset of the attribute it refused. These build
// on every platform, so that a family's encoding is tested anywhere (and
// under a big-endian byte order: `make test-bigendian`).
//
// # Sockets
//
// A Socket (Linux) is a netlink socket set up alike for every family:
// acknowledgements that carry the refused message's header alone
// (NETLINK_CAP_ACK) and the kernel's explanation (NETLINK_EXT_ACK), a
// receive buffer of Options.ReceiveBuffer (8 MiB by default, with
// CAP_NET_ADMIN beyond the system's limit), multicast groups when asked.
// It numbers requests, writes a datagram, reads one, and reads a
// request's answer to its end (Answer): the calls nfnl's transactions are
// made of. Every read and write takes a context and returns when it ends.
//
// # Batches
//
// A Conn is a Socket with a lock and batches. A Batch collects request
// messages, each encoded as it is added: a header (type and flags;
// Message adds NLM_F_REQUEST), a fixed part (a generic netlink header, an
// ifaddrmsg, an nfgenmsg) and attributes, nested or not. Builder methods
// never fail. Conn.Send cuts the batch into chunks of whole messages of
// at most Options.ChunkBytes, numbers the messages and writes each chunk
// with one sendmsg. The kernel's netlink_rcv_skb handles every message of
// the datagram in order, in the sender's system call, whatever became of
// the messages before: a failed message does not stop the others. Only
// the last message of a chunk asks for an acknowledgement (NLM_F_ACK);
// the kernel answers the others only when they fail, with an NLMSG_ERROR
// that carries their sequence number. When the last message's answer
// arrives, every earlier answer of the chunk has arrived before it, so a
// chunk costs one sendmsg and one recvmsg, plus one recvmsg per failed
// message, and Send returns the error of each message (nil for success).
//
// The kernel drops answers that do not fit the socket's receive buffer,
// and a chunk is bounded so that every message of a chunk may fail and
// still be told. Should the kernel report a lost answer (ENOBUFS), Send
// fails with ErrLost: the caller then knows nothing of that chunk and
// reads the kernel again.
//
// Nothing here is transactional: a caller that must not take a step
// unless the previous ones succeeded (IPVS's add before delete) sends
// them in separate batches and looks at the errors in between.
// Transactions are nf_tables' own, framed by nfnl on a Socket.
//
// # Reading
//
// Conn.Dump sends one request with NLM_F_DUMP and calls a function with
// each message of the answer; Conn.Get sends one request and calls it
// with the kernel's reply. A dump ends in one of three ways, the same for
// every family: complete; cut short by the kernel, whose NLMSG_DONE then
// carries an errno (an *Error); or marked as interrupted by a concurrent
// change (NLM_F_DUMP_INTR), which fails with ErrDumpInterrupted after it
// has been read to its end, for the caller to try again, as
// RetryInterrupted does.
//
// The package knows no family's objects: each family's package encodes
// its own requests and decodes its own answers.
//
// # Privileges
//
// None to open a socket in the caller's namespace; CAP_SYS_ADMIN to open
// one in another (Options.NetNS). What a request may change is the
// kernel's business: CAP_NET_ADMIN in the namespace for most.
package nl
