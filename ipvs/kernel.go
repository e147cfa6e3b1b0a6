//go:build linux

package ipvs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/ipvsnl"
	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Netmasks of a virtual server: one client is one address.
const (
	netmask4 = 0xffffffff
	netmask6 = 128
)

// kernel is the proxier's access to one network namespace: IPVS through
// generic netlink (internal/ipvsnl), the dummy link and its addresses
// through route netlink (internal/rtnl, which the userspace backend's
// link shares), both in batches of many requests to a system call
// (internal/nl). It counts the changes it makes.
type kernel struct {
	ipvs   *ipvsnl.Conn
	rt     *rtnl.Conn
	link   string
	writes int
}

// linkOwner marks the dummy link the proxier creates (its alias), so that
// Cleanup deletes that link and no other.
const linkOwner = "kproxy-ipvs"

// openKernel opens netlink sockets in ns (netns.None(): the calling
// thread's namespace, entering none) and checks that IPVS is there.
func openKernel(ctx context.Context, ns netns.NsHandle, link string) (*kernel, error) {
	h, err := ipvsnl.Open(ctx, ipvsnl.Options{NetNS: int(ns)})
	if errors.Is(err, ipvsnl.ErrNotAvailable) {
		return nil, fmt.Errorf("%w: %v", ErrIPVSUnavailable, err)
	}
	if err != nil {
		return nil, opErr("open ipvs netlink", "", err)
	}
	rt, err := rtnl.Open(ns)
	if err != nil {
		h.Close()
		return nil, opErr("open route netlink", "", err)
	}
	return &kernel{ipvs: h, rt: rt, link: link}, nil
}

func (k *kernel) close() {
	k.ipvs.Close()
	k.rt.Close()
}

// dummy returns the dummy link; ok is false when it does not exist.
func (k *kernel) dummy(ctx context.Context) (l rtnl.Link, ok bool, err error) {
	if err := ctx.Err(); err != nil {
		return rtnl.Link{}, false, err
	}
	l, ok, err = k.rt.LinkByName(ctx, k.link)
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
	if l, _, err = k.rt.EnsureDummy(ctx, k.link, linkOwner); err != nil {
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
// of the proxier's), in one batch, and leaves the link.
func (k *kernel) removeDummy(ctx context.Context) error {
	l, ok, err := k.dummy(ctx)
	if err != nil || !ok {
		return err
	}
	if l.OwnedBy(linkOwner) {
		k.writes++
		_, err := k.rt.RemoveDummy(ctx, k.link, linkOwner)
		return kernelError(err)
	}
	prefixes, err := k.addresses(ctx, l)
	if err != nil || len(prefixes) == 0 {
		return err
	}
	return firstErrors(k.changeAddresses(ctx, l, nil, prefixes))
}

// addresses lists the addresses on the link, link-local ones aside.
func (k *kernel) addresses(ctx context.Context, l rtnl.Link) ([]netip.Prefix, error) {
	list, err := k.rt.Addrs(ctx, l.Index)
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

// changeAddresses adds addrs to the link and deletes dels from it, in
// batches of requests, and returns each one's error in that order (nil
// for success, an address already there or already gone included). A
// non-nil error means it stopped part way: the outcome of the requests
// marked with it is unknown.
func (k *kernel) changeAddresses(ctx context.Context, l rtnl.Link, addrs []netip.Addr, dels []netip.Prefix) ([]error, error) {
	ops := make([]rtnl.AddrOp, 0, len(addrs)+len(dels))
	for _, a := range addrs {
		ops = append(ops, rtnl.AddrOp{Add: true, Prefix: rtnl.Host(a)})
	}
	for _, p := range dels {
		ops = append(ops, rtnl.AddrOp{Prefix: p})
	}
	k.writes += len(ops)
	errs, err := k.rt.ChangeAddrs(ctx, l.Index, 0, ops)
	for i, e := range errs {
		if ops[i].Add {
			if errors.Is(e, unix.EEXIST) {
				e = nil
			}
			errs[i] = opErr("add address", ops[i].Prefix.String()+" to "+k.link, e)
			continue
		}
		if rtnl.IsGone(e) {
			e = nil
		}
		errs[i] = opErr("delete address", ops[i].Prefix.String()+" from "+k.link, e)
	}
	if err != nil {
		return errs, opErr("change addresses of", k.link, err)
	}
	return errs, nil
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
	var list []ipvsnl.Service
	err := nl.RetryInterrupted(ctx, func() (err error) {
		list, err = k.ipvs.Services(ctx)
		return err
	})
	if err != nil {
		return nil, opErr("list virtual servers", "", err)
	}
	var out []*VirtualServer
	for _, s := range list {
		if vs, ok := fromService(&s); ok {
			out = append(out, vs)
		}
	}
	return out, nil
}

// reals lists the real servers of vs.
func (k *kernel) reals(ctx context.Context, vs *VirtualServer) ([]realInfo, error) {
	var list []ipvsnl.Dest
	err := nl.RetryInterrupted(ctx, func() (err error) {
		list, err = k.ipvs.Dests(ctx, toService(vs))
		return err
	})
	if err != nil {
		return nil, opErr("list real servers of", vs.key().String(), err)
	}
	out := make([]realInfo, 0, len(list))
	for _, d := range list {
		if !d.Addr.IsValid() {
			continue
		}
		out = append(out, realInfo{
			RealServer: RealServer{Addr: d.Addr, Port: d.Port, Weight: uint16(min(max(d.Weight, 0), 0xffff))},
			active:     int(d.ActiveConns), inactive: int(d.InactiveConns),
		})
	}
	slices.SortFunc(out, func(a, b realInfo) int { return compareReal(a.RealServer, b.RealServer) })
	return out, nil
}

// exists reports whether the kernel has a virtual server with vs's key.
func (k *kernel) exists(ctx context.Context, vs *VirtualServer) (bool, error) {
	_, ok, err := k.ipvs.Service(ctx, toService(vs))
	return ok, opErr("look up virtual server", vs.key().String(), err)
}

// opKind is a change to IPVS.
type opKind uint8

const (
	newService opKind = iota
	updateService
	delService
	newReal
	updateReal
	quiesceReal // updateReal to weight 0, for a real server that drains
	delReal
)

var opNames = [...]string{
	newService: "add virtual server", updateService: "update virtual server", delService: "delete virtual server",
	newReal: "add real server", updateReal: "update real server", quiesceReal: "quiesce real server",
	delReal: "delete real server",
}

// ipvsOp is one change to IPVS: to a virtual server, or to one of its
// real servers.
type ipvsOp struct {
	kind opKind
	vs   *VirtualServer
	r    RealServer
}

func (o ipvsOp) object() string {
	if o.kind >= newReal {
		return realName(o.vs, o.r)
	}
	return o.vs.key().String()
}

// write sends ops to IPVS, many to a system call, and returns each one's
// error in order (nil for success; an *OpError naming it else). IPVS
// handles every request whatever became of the earlier ones: ops that
// must not run after a failure go in a later call. A non-nil error means
// that write stopped part way: the outcome of the ops marked with it is
// unknown.
func (k *kernel) write(ctx context.Context, ops []ipvsOp) ([]error, error) {
	b := k.ipvs.Batch()
	var s *ipvsnl.Service
	for i, o := range ops {
		if i == 0 || o.vs != ops[i-1].vs {
			s = toService(o.vs)
		}
		switch o.kind {
		case newService:
			b.NewService(s)
		case updateService:
			b.SetService(s)
		case delService:
			b.DelService(s)
		case newReal:
			b.NewDest(s, toDest(o.r))
		case updateReal, quiesceReal:
			b.SetDest(s, toDest(o.r))
		case delReal:
			b.DelDest(s, toDest(o.r))
		}
	}
	k.writes += len(ops)
	errs, err := k.ipvs.Send(ctx, b)
	for i, e := range errs {
		errs[i] = opErr(opNames[ops[i].kind], ops[i].object(), e)
	}
	if err != nil {
		return errs, opErr("write ipvs", "", err)
	}
	return errs, nil
}

func realName(vs *VirtualServer, r RealServer) string {
	return fmt.Sprintf("%s -r %s", vs.key(), r.AddrPort())
}

func toService(vs *VirtualServer) *ipvsnl.Service {
	s := &ipvsnl.Service{FWMark: vs.FWMark, Scheduler: vs.Scheduler, Family: unix.AF_INET, Netmask: netmask4}
	if vs.FWMark == 0 {
		s.Addr, s.Protocol, s.Port = vs.Addr, uint16(vs.Protocol.Number()), vs.Port
	}
	if vs.family() == servicelb.IPv6 {
		s.Family, s.Netmask = unix.AF_INET6, netmask6
	}
	if vs.Persistence > 0 {
		s.Flags, s.Timeout = ipvsnl.FlagPersistent, vs.Persistence
	}
	if vs.HashPort {
		s.Flags |= ipvsnl.FlagSched2
	}
	return s
}

func fromService(s *ipvsnl.Service) (*VirtualServer, bool) {
	vs := &VirtualServer{Scheduler: s.Scheduler, HashPort: s.Flags&ipvsnl.FlagSched2 != 0}
	if s.Flags&ipvsnl.FlagPersistent != 0 {
		vs.Persistence = s.Timeout
	}
	if s.FWMark != 0 {
		switch s.Family {
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
	a := s.Addr.Unmap()
	if !a.IsValid() {
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

func toDest(r RealServer) *ipvsnl.Dest {
	return &ipvsnl.Dest{Addr: r.Addr, Port: r.Port, Weight: int32(r.Weight), FwdMethod: ipvsnl.Masquerade}
}
