//go:build linux

package userspace

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/sysctl"
)

// linkOwner marks the dummy link the proxy creates (its alias), so that
// Cleanup deletes that link and no other.
const linkOwner = "kproxy-userspace"

// holder keeps the addresses the listeners need on the link, marked as
// the proxy's: each address while at least one listener listens on it.
type holder struct {
	rt    *rtnl.Conn
	link  string
	index int
	proto uint8
	// refs counts the listeners of each address; ours are the addresses
	// on the link that carry the proxy's mark (added by it, or by an
	// earlier proxy and adopted).
	refs map[netip.Addr]int
	ours map[netip.Addr]bool
	// adds and dels are the changes not sent yet.
	adds, dels []netip.Addr
	// marked is set once the kernel was seen to keep the mark.
	marked bool
}

func newHolder(rt *rtnl.Conn, link string, proto uint8) *holder {
	return &holder{rt: rt, link: link, proto: proto, refs: map[netip.Addr]int{}, ours: map[netip.Addr]bool{}}
}

// ensureLink finds the link (creating a dummy link marked as the proxy's
// when it is missing) and sets it up.
func (h *holder) ensureLink(ctx context.Context) error {
	l, _, err := h.rt.EnsureDummy(ctx, h.link, linkOwner)
	if err != nil {
		return kernelError(err)
	}
	if l.Kind != "dummy" && !l.Loopback() {
		return fmt.Errorf("%s: %w (a %s link)", h.link, ErrLinkConflict, l.Kind)
	}
	if !l.Up() {
		if err := h.rt.SetUp(ctx, l); err != nil {
			return kernelError(err)
		}
	}
	h.index = l.Index
	return nil
}

// ensureStrictARP writes the settings of Options.StrictARP that differ
// (internal/sysctl.StrictARP), on every full sync, so that a setting
// someone changed back is set again.
func (p *Proxier) ensureStrictARP() error {
	ns := p.o.NetNS
	if !otherNS(ns) {
		ns = 0
	}
	changed, err := sysctl.Apply(ns, sysctl.StrictARP())
	for _, c := range changed {
		p.log.Info("userspace: sysctl set", "sysctl", c.Name, "value", c.Value, "was", c.Old)
	}
	if err != nil {
		return &OpError{Op: "set", Object: "strict ARP", Err: err}
	}
	return nil
}

// need counts one more listener on a; the first queues its add.
func (h *holder) need(a netip.Addr) {
	h.refs[a]++
	if h.refs[a] == 1 {
		h.adds = append(h.adds, a)
	}
}

// release counts one listener less on a; the last queues its delete.
func (h *holder) release(a netip.Addr) {
	h.refs[a]--
	if h.refs[a] <= 0 {
		delete(h.refs, a)
		h.dels = append(h.dels, a)
	}
}

// flushAdds adds the queued addresses that are still needed. An address
// someone else put on the link serves as well, and stays theirs.
func (h *holder) flushAdds(ctx context.Context) error {
	var ops []rtnl.AddrOp
	for _, a := range h.adds {
		if h.refs[a] > 0 && !h.ours[a] {
			ops = append(ops, rtnl.AddrOp{Add: true, Prefix: rtnl.Host(a)})
		}
	}
	h.adds = h.adds[:0]
	errs, err := h.rt.ChangeAddrs(ctx, h.index, h.proto, ops)
	if err != nil {
		return &OpError{Op: "add addresses", Object: "on " + h.link, Err: err}
	}
	var out []error
	var added []netip.Addr
	for i, e := range errs {
		a := ops[i].Prefix.Addr()
		switch {
		case e == nil:
			h.ours[a] = true
			added = append(added, a)
		case errors.Is(e, unix.EEXIST):
		default:
			out = append(out, &OpError{Op: "add address", Object: fmt.Sprintf("%s on %s", a, h.link), Err: e})
		}
	}
	if err := errors.Join(out...); err != nil {
		return err
	}
	if !h.marked && len(ops) > 0 {
		if err := h.checkMark(ctx, ops[0].Prefix.Addr()); err != nil {
			return err
		}
	}
	return kernelError(h.rt.WaitLocal(ctx, added, 2*time.Second))
}

// checkMark makes sure the kernel keeps the mark, without which the
// proxy could not tell its addresses from others.
func (h *holder) checkMark(ctx context.Context, a netip.Addr) error {
	list, err := h.rt.Addrs(ctx, h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	for _, x := range list {
		if x.Prefix.Addr() == a && x.Proto == h.proto {
			h.marked = true
			return nil
		}
	}
	return ErrNoAddressMark
}

// flushDels deletes the queued addresses that are ours and no longer
// needed.
func (h *holder) flushDels(ctx context.Context) error {
	var ops []rtnl.AddrOp
	for _, a := range h.dels {
		if h.refs[a] == 0 && h.ours[a] {
			ops = append(ops, rtnl.AddrOp{Prefix: rtnl.Host(a)})
		}
	}
	h.dels = h.dels[:0]
	return h.delete(ctx, ops)
}

func (h *holder) delete(ctx context.Context, ops []rtnl.AddrOp) error {
	errs, err := h.rt.ChangeAddrs(ctx, h.index, h.proto, ops)
	if err != nil {
		return &OpError{Op: "delete addresses", Object: "on " + h.link, Err: err}
	}
	var out []error
	for i, e := range errs {
		if e == nil || rtnl.IsGone(e) {
			delete(h.ours, ops[i].Prefix.Addr())
			continue
		}
		out = append(out, &OpError{Op: "delete address", Object: fmt.Sprintf("%s on %s", ops[i].Prefix, h.link), Err: e})
	}
	return errors.Join(out...)
}

// reconcile reads the link's addresses back: it adopts those with the
// mark, adds the needed ones that are missing and deletes the marked ones
// not needed.
func (h *holder) reconcile(ctx context.Context) error {
	list, err := h.rt.Addrs(ctx, h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	present := map[netip.Addr]bool{}
	h.ours = map[netip.Addr]bool{}
	for _, x := range list {
		present[x.Prefix.Addr()] = true
		if x.Proto == h.proto {
			h.ours[x.Prefix.Addr()] = true
		}
	}
	h.adds, h.dels = h.adds[:0], h.dels[:0]
	for a := range h.refs {
		if !present[a] {
			h.adds = append(h.adds, a)
		}
	}
	for a := range h.ours {
		if h.refs[a] == 0 {
			h.dels = append(h.dels, a)
		}
	}
	return errors.Join(h.flushAdds(ctx), h.flushDels(ctx))
}

// matches reports whether every needed address is on the link and no
// address carries the mark that is not needed.
func (h *holder) matches(ctx context.Context) (bool, error) {
	list, err := h.rt.Addrs(ctx, h.index)
	if err != nil {
		return false, &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	present, marked := 0, 0
	for _, x := range list {
		if h.refs[x.Prefix.Addr()] > 0 {
			present++
		} else if x.Proto == h.proto {
			marked++
		}
	}
	return present == len(h.refs) && marked == 0, nil
}

// removeAll deletes every marked address, and the link when the proxy
// created it (it carries the proxy's mark): a link of that name someone
// else made stays, with their addresses.
func (h *holder) removeAll(ctx context.Context) error {
	h.refs, h.adds, h.dels = map[netip.Addr]int{}, nil, nil
	l, ok, err := h.rt.LinkByName(ctx, h.link)
	if err != nil || !ok {
		h.index = 0
		return kernelError(err)
	}
	h.index = l.Index
	list, err := h.rt.Addrs(ctx, h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	var ops []rtnl.AddrOp
	for _, x := range list {
		if x.Proto == h.proto {
			ops = append(ops, rtnl.AddrOp{Prefix: x.Prefix})
		}
	}
	if err := h.delete(ctx, ops); err != nil {
		return err
	}
	h.index = 0
	_, err = h.rt.RemoveDummy(ctx, h.link, linkOwner)
	return kernelError(err)
}

// kernelError makes an error of package rtnl an OpError of the package.
func kernelError(err error) error {
	var oe *rtnl.OpError
	if errors.As(err, &oe) {
		return &OpError{Op: oe.Op, Object: oe.Object, Err: oe.Err}
	}
	return err
}
