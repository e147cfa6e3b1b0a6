//go:build linux

// Package sockdiag lists the TCP or UDP sockets of a network namespace as
// the kernel holds them (NETLINK_SOCK_DIAG's SOCK_DIAG_BY_FAMILY), and
// ends one as `ss -K` does (SOCK_DESTROY): the kernel aborts the socket,
// its owner's next receive fails with ECONNABORTED, and a connected UDP
// socket loses its peer. A socket is named by what the kernel looks it up by: family,
// protocol, both addresses, the device it is bound to and its cookie, so
// that a socket that closed and another that took its addresses is never
// ended in its stead.
//
// Listing needs the protocol's diagnostics (tcp_diag, udp_diag); ending,
// CAP_NET_ADMIN in the socket's network namespace and a kernel built with
// CONFIG_INET_DIAG_DESTROY (Debian's is). Without them, ErrUnsupported.
package sockdiag

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// ErrUnsupported is returned when the kernel has no diagnostics for the
// protocol (List: CONFIG_INET_UDP_DIAG or the module udp_diag, for TCP
// tcp_diag) or cannot end sockets (Destroy: CONFIG_INET_DIAG_DESTROY).
var ErrUnsupported = errors.New("not supported by the kernel")

// diagModule names the module of each protocol's diagnostics.
var diagModule = map[int]string{unix.IPPROTO_TCP: "tcp_diag", unix.IPPROTO_UDP: "udp_diag"}

// Socket names one socket.
type Socket struct {
	// Family is unix.AF_INET or unix.AF_INET6; an AF_INET6 socket may
	// have IPv4-mapped addresses.
	Family int
	// Protocol is unix.IPPROTO_TCP or unix.IPPROTO_UDP.
	Protocol int
	// Local and Peer are the socket's addresses (IPv4 ones unmapped);
	// Peer is the unspecified address and port 0 for a socket with none.
	Local, Peer netip.AddrPort
	// Interface is the index of the device the socket is bound to, or 0.
	Interface uint32
	// Cookie is the socket's cookie (SO_COOKIE), which BPF programs see
	// as bpf_get_socket_cookie.
	Cookie uint64
}

func (s Socket) String() string {
	return fmt.Sprintf("socket %d (protocol %d, %s to %s)", s.Cookie, s.Protocol, s.Local, s.Peer)
}

// Conn is a socket diagnostics socket of one network namespace, which
// lists and ends the sockets there.
type Conn struct{ c *nl.Conn }

// Open opens a Conn in the network namespace of the open file descriptor
// netns (0: the calling thread's).
func Open(netns int) (*Conn, error) {
	c, err := nl.Open(unix.NETLINK_SOCK_DIAG, nl.Options{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("open socket diagnostics: %w", err)
	}
	return &Conn{c: c}, nil
}

// Close closes the Conn.
func (c *Conn) Close() error { return c.c.Close() }

// Established is the state of a connected UDP socket, and of a TCP
// connection's: List's states take it as 1 << Established.
const Established = 1

// List returns the sockets of protocol (unix.IPPROTO_TCP or
// unix.IPPROTO_UDP), IPv4 and IPv6, of the Conn's namespace whose state is
// one of the bits of states (1 << Established: connected UDP sockets).
// Their addresses are the kernel's own, which no BPF program rewrites as
// it may rewrite getpeername(2)'s. A dump the kernel marks as interrupted
// by a concurrent change fails with nl.ErrDumpInterrupted.
func (c *Conn) List(ctx context.Context, protocol int, states uint32) ([]Socket, error) {
	var out []Socket
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		req := make([]byte, reqLen)
		req[0], req[1] = byte(family), byte(protocol)
		binary.NativeEndian.PutUint32(req[4:], states)
		var b nl.Batch
		b.Message(unix.SOCK_DIAG_BY_FAMILY, 0, req...)
		err := c.c.Dump(ctx, &b, func(_ uint16, data []byte) error {
			s, err := parseMsg(data, protocol)
			if err == nil {
				out = append(out, s)
			}
			return err
		})
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("list sockets of family %d, protocol %d: no diagnostics for the protocol (%s): %w",
				family, protocol, diagModule[protocol], ErrUnsupported)
		}
		if err != nil {
			return nil, fmt.Errorf("list sockets of family %d, protocol %d: %w", family, protocol, err)
		}
	}
	return out, nil
}

// msgLen is the size of struct inet_diag_msg.
const msgLen = 72

// parseMsg decodes a struct inet_diag_msg: family, state, timer,
// retransmits, then struct inet_diag_sockid as in request.
func parseMsg(b []byte, protocol int) (Socket, error) {
	if len(b) < msgLen {
		return Socket{}, fmt.Errorf("socket diagnostics message of %d bytes, want %d", len(b), msgLen)
	}
	s := Socket{Family: int(b[0]), Protocol: protocol}
	id := b[4:]
	addr := func(a []byte) netip.Addr {
		if s.Family == unix.AF_INET {
			return netip.AddrFrom4([4]byte(a[:4]))
		}
		return netip.AddrFrom16([16]byte(a[:16])).Unmap()
	}
	s.Local = netip.AddrPortFrom(addr(id[4:20]), binary.BigEndian.Uint16(id[0:]))
	s.Peer = netip.AddrPortFrom(addr(id[20:36]), binary.BigEndian.Uint16(id[2:]))
	s.Interface = binary.NativeEndian.Uint32(id[36:])
	s.Cookie = uint64(binary.NativeEndian.Uint32(id[40:])) | uint64(binary.NativeEndian.Uint32(id[44:]))<<32
	return s, nil
}

// Destroy ends s, a socket of the Conn's namespace. A socket that is gone
// already, or whose cookie differs, is an error wrapping unix.ENOENT.
func (c *Conn) Destroy(ctx context.Context, s Socket) error {
	req, err := s.request()
	if err != nil {
		return err
	}
	var b nl.Batch
	b.Message(unix.SOCK_DESTROY, 0, req...)
	if err := c.c.Get(ctx, &b, nil); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("end %s: the kernel cannot end sockets (CONFIG_INET_DIAG_DESTROY): %w", s, ErrUnsupported)
		}
		return fmt.Errorf("end %s: %w", s, err)
	}
	return nil
}

// reqLen is the size of struct inet_diag_req_v2.
const reqLen = 56

// request encodes s as a struct inet_diag_req_v2: family, protocol,
// extensions, padding, the states (all), and struct inet_diag_sockid:
// ports and addresses in network order, then the device and the cookie
// in the host's.
func (s Socket) request() ([]byte, error) {
	b := make([]byte, reqLen)
	b[0], b[1] = byte(s.Family), byte(s.Protocol)
	binary.NativeEndian.PutUint32(b[4:], ^uint32(0))
	src, dst := s.Local, s.Peer
	if !dst.IsValid() {
		return nil, fmt.Errorf("%s has no peer", s)
	}
	binary.BigEndian.PutUint16(b[8:], src.Port())
	binary.BigEndian.PutUint16(b[10:], dst.Port())
	if err := putAddr(b[12:28], s.Family, src.Addr()); err != nil {
		return nil, err
	}
	if err := putAddr(b[28:44], s.Family, dst.Addr()); err != nil {
		return nil, err
	}
	binary.NativeEndian.PutUint32(b[44:], s.Interface)
	binary.NativeEndian.PutUint32(b[48:], uint32(s.Cookie))
	binary.NativeEndian.PutUint32(b[52:], uint32(s.Cookie>>32))
	return b, nil
}

// putAddr writes a as an address of family: 4 bytes of an IPv4 socket's,
// 16 of an IPv6 socket's (IPv4-mapped for an IPv4 peer).
func putAddr(b []byte, family int, a netip.Addr) error {
	switch {
	case family == unix.AF_INET && a.Unmap().Is4():
		v := a.Unmap().As4()
		copy(b, v[:])
	case family == unix.AF_INET6:
		v := a.As16()
		copy(b, v[:])
	default:
		return fmt.Errorf("address %s of family %d", a, family)
	}
	return nil
}
