package nl

// Options configure a Conn or a Socket.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to,
	// such as a github.com/vishvananda/netns.NsHandle; zero or negative
	// means the caller's. The socket stays bound to it: the descriptor
	// may be closed once Open returns.
	NetNS int
	// ChunkBytes bounds the messages of one sendmsg of Conn.Send; zero
	// means DefaultChunkBytes. A message longer than the bound goes
	// alone.
	ChunkBytes int
	// ReceiveBuffer is the socket's receive buffer in bytes; zero means
	// DefaultReceiveBuffer.
	ReceiveBuffer int
	// ReadBuffer is the size of the buffer a datagram is read into at
	// first; zero means 64 KiB. A datagram that does not fit is lost
	// with an error, and the buffer doubles.
	ReadBuffer int
	// Groups are the multicast groups whose notifications the socket
	// receives (a bit each: RTMGRP_IPV4_IFADDR, ...), read with
	// Socket.Read.
	Groups uint32
}

// DefaultChunkBytes bounds a chunk: about a thousand IPVS requests, whose
// error answers, should every one fail, fit the default receive buffer.
const DefaultChunkBytes = 128 << 10

// DefaultReceiveBuffer is the receive buffer of a socket opened with none
// given: room for the answers of a chunk of which every request failed,
// and for the notifications of a burst of changes.
const DefaultReceiveBuffer = 8 << 20

// Stats count what a Conn sent.
type Stats struct {
	// Datagrams counts the sendmsg calls, Messages the requests in them.
	Datagrams, Messages int
}
