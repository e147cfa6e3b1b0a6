//go:build linux

package ipvs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
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
// generic netlink, the dummy link and its addresses through route netlink
// (package internal/rtnl, which the userspace backend's link shares). It
// counts the changes it makes.
type kernel struct {
	nl     *netlink.Handle
	rt     *rtnl.Conn
	ipvs   *ipvs.Handle
	link   string
	writes int
}

// linkOwner marks the dummy link the proxier creates (its alias), so that
// Cleanup deletes that link and no other.
const linkOwner = "kproxy-ipvs"

// openKernel opens netlink handles in ns (netns.None(): the calling
// thread's namespace, entering none) and checks that IPVS is there.
func openKernel(ns netns.NsHandle, link string) (*kernel, error) {
	nl, err := netlink.NewHandleAt(ns, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, opErr("open netlink", "", err)
	}
	if _, err := nl.GenlFamilyGet("IPVS"); err != nil {
		nl.Close()
		return nil, fmt.Errorf("%w: generic netlink family IPVS: %v", ErrIPVSUnavailable, err)
	}
	rt, err := rtnl.Open(ns)
	if err != nil {
		nl.Close()
		return nil, opErr("open route netlink", "", err)
	}
	path := "" // moby/ipvs enters no namespace for ""
	if ns.IsOpen() {
		path = fmt.Sprintf("/proc/self/fd/%d", int(ns))
	}
	h, err := ipvs.New(path)
	if err != nil {
		rt.Close()
		nl.Close()
		return nil, opErr("open ipvs netlink", "", err)
	}
	return &kernel{nl: nl, rt: rt, ipvs: h, link: link}, nil
}

func (k *kernel) close() {
	k.ipvs.Close()
	k.rt.Close()
	k.nl.Close()
}

// dummy returns the dummy link; ok is false when it does not exist.
func (k *kernel) dummy(ctx context.Context) (l rtnl.Link, ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return rtnl.Link{}, false, err
	}
	l, ok, err = k.rt.LinkByName(k.link)
	if err != nil {
		return rtnl.Link{}, false, kernelError(err)
	}
	if ok && l.Kind != "dummy" {
		return rtnl.Link{}, false, fmt.Errorf("%w: %s is a %s link", ErrLinkConflict, k.link, cmp.Or(l.Kind, "device"))
	}
	return l, ok, nil
}

// ensureDummy returns the dummy link, creating it (marked as the
// proxier's) if needed.
func (k *kernel) ensureDummy(ctx context.Context) (rtnl.Link, error) {
	l, ok, err := k.dummy(ctx)
	if err != nil || ok {
		return l, err
	}
	k.writes++
	if l, _, err = k.rt.EnsureDummy(k.link, linkOwner); err != nil {
		return rtnl.Link{}, kernelError(err)
	}
	if l.Kind != "dummy" {
		return rtnl.Link{}, fmt.Errorf("%w: %s is a %s link", ErrLinkConflict, k.link, cmp.Or(l.Kind, "device"))
	}
	return l, nil
}

// removeDummy deletes the dummy link, and with it every address on it,
// when the proxier created it; from a dummy link someone else made, it
// deletes the addresses (every address on the link is a virtual address
// of the proxier's) and leaves the link.
func (k *kernel) removeDummy(ctx context.Context) error {
	l, ok, err := k.dummy(ctx)
	if err != nil || !ok {
		return err
	}
	if l.OwnedBy(linkOwner) {
		k.writes++
		_, err := k.rt.RemoveDummy(k.link, linkOwner)
		return kernelError(err)
	}
	prefixes, err := k.addresses(ctx, l)
	if err != nil {
		return err
	}
	for _, p := range prefixes {
		if err := k.delAddress(ctx, l, p); err != nil {
			return err
		}
	}
	return nil
}

// addresses lists the addresses on the link, link-local ones aside.
func (k *kernel) addresses(ctx context.Context, l rtnl.Link) ([]netip.Prefix, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	list, err := k.rt.Addrs(l.Index)
	if err != nil {
		return nil, opErr("list addresses of", k.link, err)
	}
	var out []netip.Prefix
	for _, a := range list {
		if !a.Prefix.Addr().IsLinkLocalUnicast() {
			out = append(out, a.Prefix)
		}
	}
	return out, nil
}

func (k *kernel) addAddress(ctx context.Context, l rtnl.Link, a netip.Addr) error {
	p := rtnl.Host(a)
	err := k.changeAddress(ctx, l, rtnl.AddrOp{Add: true, Prefix: p})
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return opErr("add address", p.String()+" to "+k.link, err)
}

func (k *kernel) delAddress(ctx context.Context, l rtnl.Link, p netip.Prefix) error {
	err := k.changeAddress(ctx, l, rtnl.AddrOp{Prefix: p})
	if rtnl.IsGone(err) {
		return nil
	}
	return opErr("delete address", p.String()+" from "+k.link, err)
}

func (k *kernel) changeAddress(ctx context.Context, l rtnl.Link, op rtnl.AddrOp) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k.writes++
	errs, err := k.rt.ChangeAddrs(l.Index, 0, []rtnl.AddrOp{op})
	if err != nil {
		return err
	}
	return errs[0]
}

// kernelError makes an error of package rtnl an OpError of the package.
func kernelError(err error) error {
	var oe *rtnl.OpError
	if errors.As(err, &oe) {
		return &OpError{Op: oe.Op, Object: oe.Object, Err: oe.Err}
	}
	return err
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
