//go:build linux

// Package nlsock opens the netlink sockets that kproxy's netlink layers
// (internal/nfnl for nf_tables, internal/nl for route and generic
// netlink) send through, set up alike: bound, acknowledgements that carry
// only the failed message's header and the kernel's explanation, and a
// receive buffer beyond the system limit where the caller may set one.
package nlsock

import (
	"fmt"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// DefaultReceiveBuffer is the receive buffer of a socket opened with none
// given.
const DefaultReceiveBuffer = 8 << 20

// Open opens a netlink socket of protocol proto in the network namespace
// netns (0: the calling thread's), named name for the runtime's poller,
// with a receive buffer of rcvbuf bytes (DefaultReceiveBuffer when 0 or
// less).
func Open(proto int, name string, netns, rcvbuf int) (*socket.Conn, error) {
	s, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, proto, name, &socket.Config{NetNS: max(netns, 0)})
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	if err := setup(s, rcvbuf); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func setup(s *socket.Conn, rcvbuf int) error {
	if err := s.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind netlink socket: %w", err)
	}
	// Errors carry only the failed message's header, not its payload, and
	// the kernel's explanation when it has one.
	for _, opt := range []int{unix.NETLINK_CAP_ACK, unix.NETLINK_EXT_ACK} {
		if err := s.SetsockoptInt(unix.SOL_NETLINK, opt, 1); err != nil {
			return fmt.Errorf("set netlink socket option %d: %w", opt, err)
		}
	}
	if rcvbuf <= 0 {
		rcvbuf = DefaultReceiveBuffer
	}
	return SetBuffer(s, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, rcvbuf)
}

// SetBuffer sets a socket buffer (force and plain: SO_RCVBUFFORCE and
// SO_RCVBUF, or the SNDBUF pair) to size bytes: beyond the system limit
// when allowed (CAP_NET_ADMIN), else as far as the limit goes.
func SetBuffer(s *socket.Conn, force, plain, size int) error {
	if err := s.SetsockoptInt(unix.SOL_SOCKET, force, size); err == nil {
		return nil
	}
	if err := s.SetsockoptInt(unix.SOL_SOCKET, plain, size); err != nil {
		return fmt.Errorf("set socket buffer to %d bytes: %w", size, err)
	}
	return nil
}
