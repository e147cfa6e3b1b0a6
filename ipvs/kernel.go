//go:build linux

package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// IPVS constants the moby package does not export.
const (
	svcFlagPersistent = 0x1  // IP_VS_SVC_F_PERSISTENT
	svcFlagHashPort   = 0x10 // IP_VS_SVC_F_SCHED2: sh-port, mh-port
	netmask4          = 0xffffffff
	netmask6          = 128
)

// kernel is the proxier's access to one network namespace: IPVS through
// generic netlink, the dummy link and its addresses through rtnetlink. It
// counts the changes it makes.
type kernel struct {
	nl     *netlink.Handle
	ipvs   *ipvs.Handle
	link   string
	writes int
}

// openKernel opens netlink handles in ns (netns.None(): the calling
// thread's namespace, entering none) and checks that IPVS is there.
func openKernel(ns netns.NsHandle, link string) (*kernel, error) {
	nl, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, opErr("open netlink", "", err)
	}
	if _, err := nl.GenlFamilyGet("IPVS"); err != nil {
		nl.Close()
		return nil, fmt.Errorf("%w: generic netlink family IPVS: %v", ErrIPVSUnavailable, err)
	}
	path := "" // moby/ipvs enters no namespace for ""
	if ns.IsOpen() {
		path = fmt.Sprintf("/proc/self/fd/%d", int(ns))
	}
	h, err := ipvs.New(path)
	if err != nil {
		nl.Close()
		return nil, opErr("open ipvs netlink", "", err)
	}
	return &kernel{nl: nl, ipvs: h, link: link}, nil
}

func (k *kernel) close() {
	k.ipvs.Close()
	k.nl.Close()
}

// dummy returns the dummy link, nil if it does not exist.
func (k *kernel) dummy(ctx context.Context) (netlink.Link, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l, err := k.nl.LinkByName(k.link)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, opErr("find link", k.link, err)
	}
	if l.Type() != "dummy" {
		return nil, fmt.Errorf("%w: %s is a %s link", ErrLinkConflict, k.link, l.Type())
	}
	return l, nil
}

// ensureDummy returns the dummy link, creating it if needed.
func (k *kernel) ensureDummy(ctx context.Context) (netlink.Link, error) {
	l, err := k.dummy(ctx)
	if err != nil || l != nil {
		return l, err
	}
	la := netlink.NewLinkAttrs()
	la.Name = k.link
	k.writes++
	if err := k.nl.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
		return nil, opErr("add dummy link", k.link, err)
	}
	l, err = k.dummy(ctx)
	if err == nil && l == nil {
		err = opErr("find link", k.link, errors.New("gone right after it was added"))
	}
	return l, err
}

// deleteDummy removes the dummy link and with it every address on it.
func (k *kernel) deleteDummy(ctx context.Context) error {
	l, err := k.dummy(ctx)
	if err != nil || l == nil {
		return err
	}
	k.writes++
	return opErr("delete dummy link", k.link, k.nl.LinkDel(l))
}

// addresses lists the addresses on the link, link-local ones aside.
func (k *kernel) addresses(ctx context.Context, l netlink.Link) ([]netip.Prefix, error) {
	var list []netlink.Addr
	err := retryInterrupted(ctx, func() (err error) {
		list, err = k.nl.AddrList(l, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		return nil, opErr("list addresses of", k.link, err)
	}
	var out []netip.Prefix
	for _, a := range list {
		p, ok := prefixOf(a.IPNet)
		if ok && !p.Addr().IsLinkLocalUnicast() {
			out = append(out, p)
		}
	}
	return out, nil
}

func (k *kernel) addAddress(ctx context.Context, l netlink.Link, a netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.writes++
	p := netip.PrefixFrom(a, a.BitLen())
	err := k.nl.AddrAdd(l, &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return opErr("add address", p.String()+" to "+k.link, err)
}

func (k *kernel) delAddress(ctx context.Context, l netlink.Link, p netip.Prefix) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.writes++
	err := k.nl.AddrDel(l, &netlink.Addr{IPNet: ipNet(p)})
	if errors.Is(err, unix.EADDRNOTAVAIL) {
		return nil
	}
	return opErr("delete address", p.String()+" from "+k.link, err)
}

// realInfo is a real server as the kernel reports it.
type realInfo struct {
	RealServer
	active, inactive int
}

// services lists every IPVS virtual server in the namespace, address ones
// of a known protocol and firewall-mark ones, without real servers.
func (k *kernel) services(ctx context.Context) ([]*VirtualServer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := k.ipvs.GetServices()
	if err != nil {
		return nil, opErr("list virtual servers", "", err)
	}
	var out []*VirtualServer
	for _, s := range list {
		if vs, ok := fromService(s); ok {
			out = append(out, vs)
		}
	}
	return out, nil
}

// reals lists the real servers of vs.
func (k *kernel) reals(ctx context.Context, vs *VirtualServer) ([]realInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := k.ipvs.GetDestinations(toService(vs))
	if err != nil {
		return nil, opErr("list real servers of", vs.key().String(), err)
	}
	out := make([]realInfo, 0, len(list))
	for _, d := range list {
		a, ok := addrOf(d.Address)
		if !ok {
			continue
		}
		out = append(out, realInfo{
			RealServer: RealServer{Addr: a, Port: d.Port, Weight: uint16(min(max(d.Weight, 0), 0xffff))},
			active:     d.ActiveConnections, inactive: d.InactiveConnections,
		})
	}
	slices.SortFunc(out, func(a, b realInfo) int { return compareReal(a.RealServer, b.RealServer) })
	return out, nil
}

// exists reports whether the kernel has a virtual server with vs's key.
func (k *kernel) exists(ctx context.Context, vs *VirtualServer) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return k.ipvs.IsServicePresent(toService(vs)), nil
}

func (k *kernel) newService(ctx context.Context, vs *VirtualServer) error {
	return k.do(ctx, "add virtual server", vs.key().String(), func() error { return k.ipvs.NewService(toService(vs)) })
}

func (k *kernel) updateService(ctx context.Context, vs *VirtualServer) error {
	return k.do(ctx, "update virtual server", vs.key().String(), func() error { return k.ipvs.UpdateService(toService(vs)) })
}

func (k *kernel) delService(ctx context.Context, vs *VirtualServer) error {
	return k.do(ctx, "delete virtual server", vs.key().String(), func() error { return k.ipvs.DelService(toService(vs)) })
}

func (k *kernel) newReal(ctx context.Context, vs *VirtualServer, r RealServer) error {
	return k.do(ctx, "add real server", realName(vs, r), func() error { return k.ipvs.NewDestination(toService(vs), toDest(r)) })
}

func (k *kernel) updateReal(ctx context.Context, vs *VirtualServer, r RealServer) error {
	return k.do(ctx, "update real server", realName(vs, r), func() error { return k.ipvs.UpdateDestination(toService(vs), toDest(r)) })
}

func (k *kernel) delReal(ctx context.Context, vs *VirtualServer, r RealServer) error {
	return k.do(ctx, "delete real server", realName(vs, r), func() error { return k.ipvs.DelDestination(toService(vs), toDest(r)) })
}

// do runs one change unless ctx has ended.
func (k *kernel) do(ctx context.Context, op, object string, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.writes++
	return opErr(op, object, f())
}

func realName(vs *VirtualServer, r RealServer) string {
	return fmt.Sprintf("%s -r %s", vs.key(), r.AddrPort())
}

func toService(vs *VirtualServer) *ipvs.Service {
	s := &ipvs.Service{FWMark: vs.FWMark, SchedName: vs.Scheduler, AddressFamily: unix.AF_INET, Netmask: netmask4}
	if vs.FWMark == 0 {
		s.Address, s.Protocol, s.Port = net.IP(vs.Addr.AsSlice()), uint16(vs.Protocol.Number()), vs.Port
	}
	if vs.family() == servicelb.IPv6 {
		s.AddressFamily, s.Netmask = unix.AF_INET6, netmask6
	}
	if vs.Persistence > 0 {
		s.Flags, s.Timeout = svcFlagPersistent, vs.Persistence
	}
	if vs.HashPort {
		s.Flags |= svcFlagHashPort
	}
	return s
}

func fromService(s *ipvs.Service) (*VirtualServer, bool) {
	vs := &VirtualServer{Scheduler: s.SchedName, HashPort: s.Flags&svcFlagHashPort != 0}
	if s.Flags&svcFlagPersistent != 0 {
		vs.Persistence = s.Timeout
	}
	if s.FWMark != 0 {
		switch s.AddressFamily {
		case unix.AF_INET:
			vs.Family = servicelb.IPv4
		case unix.AF_INET6:
			vs.Family = servicelb.IPv6
		default:
			return nil, false
		}
		vs.FWMark = s.FWMark
		return vs, true
	}
	a, ok := addrOf(s.Address)
	if !ok {
		return nil, false
	}
	switch s.Protocol {
	case unix.IPPROTO_TCP:
		vs.Protocol = servicelb.TCP
	case unix.IPPROTO_UDP:
		vs.Protocol = servicelb.UDP
	case unix.IPPROTO_SCTP:
		vs.Protocol = servicelb.SCTP
	default:
		return nil, false
	}
	vs.Addr, vs.Port = a, s.Port
	return vs, true
}

func toDest(r RealServer) *ipvs.Destination {
	return &ipvs.Destination{Address: net.IP(r.Addr.AsSlice()), Port: r.Port, Weight: int(r.Weight),
		ConnectionFlags: ipvs.ConnectionFlagMasq}
}

func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := addrOf(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones), ok
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// retryInterrupted runs a netlink dump again while the kernel reports it
// was interrupted by a concurrent change.
func retryInterrupted(ctx context.Context, f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || i == 9 {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
