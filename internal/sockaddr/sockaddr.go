//go:build linux

// Package sockaddr converts between net/netip addresses and the socket
// addresses of golang.org/x/sys/unix, for code that makes its own sockets.
package sockaddr

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// From converts an address and port to a unix.Sockaddr of its family.
func From(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// To converts an IPv4 or IPv6 unix.Sockaddr back, an IPv4-mapped IPv6
// address unmapped; any other kind gives the zero AddrPort.
func To(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}
