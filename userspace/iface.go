//go:build linux

package userspace

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
)

// The interface a flow came in on, for a node that tells its pods by
// interface (servicelb.LocalByBridgeInterface, LocalByInterfaceNamePrefix),
// as a packet filter's iifname does. It is looked up only for such a node,
// once per connection or UDP session:
//
//   - TCP: the kernel keeps the interface of a connection's first packet
//     in the accepted socket, and tells it as the IP_PKTINFO (IPV6_PKTINFO)
//     of IP_PKTOPTIONS (IPV6_2292PKTOPTIONS).
//   - UDP: each datagram's IP_PKTINFO (IPV6_PKTINFO), which the listener
//     asks for.
//   - SCTP, whose sockets tell no interface: the interface the node routes
//     the client's address through (a route lookup), which is the one its
//     packets come in on where routing is symmetric, as rp_filter assumes.

// isPodIface reports whether the interface named name is one of the
// node's pods' under its detection; false when name is unknown.
func (nd *node) isPodIface(name string) bool {
	switch {
	case nd.iface == "" || name == "":
		return false
	case nd.ifacePrefix:
		return strings.HasPrefix(name, nd.iface)
	}
	return name == nd.iface
}

// ifaceName returns the name of interface index in the namespace of
// socket fd, or "".
func ifaceName(fd, index int) string {
	if index <= 0 {
		return ""
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return ""
	}
	ifr.SetUint32(uint32(index))
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr); err != nil {
		return ""
	}
	return ifr.Name()
}

// pktinfo returns the level and type of the packet information control
// message of a family, and the option that asks for it.
func pktinfo(v6 bool) (level, typ, ask int) {
	if v6 {
		return unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, unix.IPV6_RECVPKTINFO
	}
	return unix.IPPROTO_IP, unix.IP_PKTINFO, unix.IP_PKTINFO
}

// pktinfoIndex reads the interface index out of control messages, or 0.
func pktinfoIndex(oob []byte, v6 bool) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	level, typ, _ := pktinfo(v6)
	for _, m := range msgs {
		if int(m.Header.Level) != level || int(m.Header.Type) != typ {
			continue
		}
		switch {
		case !v6 && len(m.Data) >= unix.SizeofInet4Pktinfo: // ipi_ifindex first
			return int(int32(binary.NativeEndian.Uint32(m.Data[0:4])))
		case v6 && len(m.Data) >= unix.SizeofInet6Pktinfo: // after the address
			return int(binary.NativeEndian.Uint32(m.Data[16:20]))
		}
	}
	return 0
}

// tcpIface returns the name of the interface the first packet of an
// accepted TCP connection came in on, or "".
func tcpIface(f *os.File, v6 bool) string {
	rc, err := f.SyscallConn()
	if err != nil {
		return ""
	}
	var name string
	_ = rc.Control(func(fd uintptr) {
		level, _, ask := pktinfo(v6)
		opt := unix.IP_PKTOPTIONS
		if v6 {
			opt = unix.IPV6_2292PKTOPTIONS
		}
		if unix.SetsockoptInt(int(fd), level, ask, 1) != nil {
			return
		}
		var buf [64]byte
		n := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		// Off again: with it on, an IPv6 socket keeps a copy of the
		// options of every packet it takes in.
		_ = unix.SetsockoptInt(int(fd), level, ask, 0)
		if e == 0 && int(n) <= len(buf) {
			name = ifaceName(int(fd), pktinfoIndex(buf[:n], v6))
		}
	})
	return name
}

// routes looks up the interface the node routes an address through, for
// SCTP flows, on a route netlink socket of the namespace opened at the
// first lookup.
type routes struct {
	mu  sync.Mutex
	ns  netns.NsHandle
	rt  *rtnl.Conn
	err error
}

// routeTimeout bounds a route lookup: the kernel answers at once, and
// the bound only guards a connection's goroutine against a kernel bug.
const routeTimeout = 10 * time.Second

// iface returns the name of the interface the namespace routes to a
// through, or "".
func (r *routes) iface(a netip.Addr) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rt == nil && r.err == nil {
		r.rt, r.err = rtnl.Open(r.ns)
	}
	if r.err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), routeTimeout)
	defer cancel()
	index, err := r.rt.RouteOIF(ctx, a)
	if err != nil {
		return ""
	}
	rc, err := r.rt.SyscallConn()
	if err != nil {
		return ""
	}
	name := ""
	_ = rc.Control(func(fd uintptr) { name = ifaceName(int(fd), index) })
	return name
}

func (r *routes) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rt != nil {
		r.rt.Close()
		r.rt = nil
	}
	r.err = nil
}
