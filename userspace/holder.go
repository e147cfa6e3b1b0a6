//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// holder keeps the addresses the listeners need on the link, marked as
// the proxy's: each address while at least one listener listens on it.
type holder struct {
	rt    *rtnl
	ns    netns.NsHandle
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

func newHolder(rt *rtnl, ns netns.NsHandle, link string, proto uint8) *holder {
	return &holder{rt: rt, ns: ns, link: link, proto: proto, refs: map[netip.Addr]int{}, ours: map[netip.Addr]bool{}}
}

// ensureLink finds the link (creating the dummy link when it is missing
// and not the loopback) and sets it up.
func (h *holder) ensureLink() error { return h.findLink(true) }

// findLink finds the link, and creates it when create is set; without
// it, a missing dummy link leaves h.index 0.
func (h *holder) findLink(create bool) error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(h.link)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf) && h.link != DefaultLink && !create:
		h.index = 0
		return nil
	case errors.As(err, &nf) && h.link != DefaultLink:
		la := netlink.NewLinkAttrs()
		la.Name = h.link
		if err := nh.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
			return &OpError{Op: "add dummy link", Object: h.link, Err: err}
		}
		if l, err = nh.LinkByName(h.link); err != nil {
			return &OpError{Op: "find link", Object: h.link, Err: err}
		}
	case err != nil:
		return &OpError{Op: "find link", Object: h.link, Err: err}
	case l.Type() != "dummy" && l.Attrs().RawFlags&unix.IFF_LOOPBACK == 0:
		return fmt.Errorf("%s: %w (a %s link)", h.link, ErrLinkConflict, l.Type())
	}
	if l.Attrs().RawFlags&unix.IFF_UP == 0 {
		if err := nh.LinkSetUp(l); err != nil {
			return &OpError{Op: "set link up", Object: h.link, Err: err}
		}
	}
	h.index = l.Attrs().Index
	return nil
}

func (h *holder) handle() (*netlink.Handle, error) {
	var nh *netlink.Handle
	var err error
	if otherNS(h.ns) {
		nh, err = netlink.NewHandleAt(h.ns, unix.NETLINK_ROUTE)
	} else {
		nh, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, &OpError{Op: "open netlink", Object: h.link, Err: err}
	}
	return nh, nil
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
func (h *holder) flushAdds() error {
	var ops []addrOp
	for _, a := range h.adds {
		if h.refs[a] > 0 && !h.ours[a] {
			ops = append(ops, addrOp{add: true, a: a})
		}
	}
	h.adds = h.adds[:0]
	errs, err := h.rt.change(h.index, h.proto, ops)
	if err != nil {
		return &OpError{Op: "add addresses", Object: "on " + h.link, Err: err}
	}
	var out []error
	for i, e := range errs {
		switch {
		case e == nil:
			h.ours[ops[i].a] = true
		case errors.Is(e, unix.EEXIST):
		default:
			out = append(out, &OpError{Op: "add address", Object: fmt.Sprintf("%s on %s", ops[i].a, h.link), Err: e})
		}
	}
	if err := errors.Join(out...); err != nil {
		return err
	}
	if !h.marked && len(ops) > 0 {
		if err := h.checkMark(ops[0].a); err != nil {
			return err
		}
	}
	return h.waitLocal(ops)
}

// waitLocal waits for the IPv6 addresses just added to be routed to the
// node: the kernel routes a new IPv6 address only once it has left its
// tentative state, a moment after the add returns, and a flow that came
// meanwhile would be routed elsewhere.
func (h *holder) waitLocal(ops []addrOp) error {
	var want []netip.Addr
	for _, op := range ops {
		if op.a.Is6() && h.ours[op.a] {
			want = append(want, op.a)
		}
	}
	for i := 0; len(want) > 0; i++ {
		local, err := h.rt.localIPv6()
		if err != nil {
			return &OpError{Op: "list local routes", Object: "ipv6", Err: err}
		}
		want = slices.DeleteFunc(want, func(a netip.Addr) bool { return local[a] })
		if len(want) == 0 {
			return nil
		}
		if i == 2000 {
			return &OpError{Op: "wait for the local route", Object: want[0].String(), Err: unix.ETIMEDOUT}
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// checkMark makes sure the kernel keeps the mark, without which the
// proxy could not tell its addresses from others.
func (h *holder) checkMark(a netip.Addr) error {
	list, err := h.rt.dump(h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	for _, x := range list {
		if x.a == a && x.proto == h.proto {
			h.marked = true
			return nil
		}
	}
	return ErrNoAddressMark
}

// flushDels deletes the queued addresses that are ours and no longer
// needed.
func (h *holder) flushDels() error {
	var ops []addrOp
	for _, a := range h.dels {
		if h.refs[a] == 0 && h.ours[a] {
			ops = append(ops, addrOp{a: a})
		}
	}
	h.dels = h.dels[:0]
	return h.delete(ops)
}

func (h *holder) delete(ops []addrOp) error {
	errs, err := h.rt.change(h.index, h.proto, ops)
	if err != nil {
		return &OpError{Op: "delete addresses", Object: "on " + h.link, Err: err}
	}
	var out []error
	for i, e := range errs {
		if e == nil || isGone(e) {
			delete(h.ours, ops[i].a)
			continue
		}
		out = append(out, &OpError{Op: "delete address", Object: fmt.Sprintf("%s on %s", ops[i].a, h.link), Err: e})
	}
	return errors.Join(out...)
}

// reconcile reads the link's addresses back: it adopts those with the
// mark, adds the needed ones that are missing and deletes the marked ones
// not needed.
func (h *holder) reconcile() error {
	list, err := h.rt.dump(h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	present := map[netip.Addr]bool{}
	h.ours = map[netip.Addr]bool{}
	for _, x := range list {
		present[x.a] = true
		if x.proto == h.proto {
			h.ours[x.a] = true
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
	return errors.Join(h.flushAdds(), h.flushDels())
}

// matches reports whether every needed address is on the link and no
// address carries the mark that is not needed.
func (h *holder) matches() (bool, error) {
	list, err := h.rt.dump(h.index)
	if err != nil {
		return false, &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	present, marked := 0, 0
	for _, x := range list {
		if h.refs[x.a] > 0 {
			present++
		} else if x.proto == h.proto {
			marked++
		}
	}
	return present == len(h.refs) && marked == 0, nil
}

// removeAll deletes every marked address, and a dummy link of the proxy.
func (h *holder) removeAll() error {
	if err := h.findLink(false); err != nil || h.index == 0 {
		return err
	}
	list, err := h.rt.dump(h.index)
	if err != nil {
		return &OpError{Op: "list addresses", Object: "of " + h.link, Err: err}
	}
	var ops []addrOp
	for _, x := range list {
		if x.proto == h.proto {
			ops = append(ops, addrOp{a: x.a})
		}
	}
	h.refs, h.adds, h.dels = map[netip.Addr]int{}, nil, nil
	err = h.delete(ops)
	if h.link == DefaultLink || err != nil {
		return err
	}
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(h.link)
	if err != nil {
		return nil // gone already
	}
	if err := nh.LinkDel(l); err != nil {
		return &OpError{Op: "delete dummy link", Object: h.link, Err: err}
	}
	return nil
}
