//go:build linux

package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// Link is a network interface as the kernel lists it.
type Link struct {
	Index int
	Name  string
	// Kind is the link's kind, such as "dummy" or "veth"; empty for a
	// link without one (the loopback, a physical device).
	Kind string
	// Flags are the interface flags (unix.IFF_UP, unix.IFF_LOOPBACK...).
	Flags uint32
	// Alias is the link's alias (IFLA_IFALIAS): a dummy link created by
	// EnsureDummy carries its owner's mark there.
	Alias string
}

// Loopback reports whether the link is a loopback device.
func (l Link) Loopback() bool { return l.Flags&unix.IFF_LOOPBACK != 0 }

// Up reports whether the link is administratively up.
func (l Link) Up() bool { return l.Flags&unix.IFF_UP != 0 }

// OwnedBy reports whether the link carries owner's mark: EnsureDummy
// created it for owner.
func (l Link) OwnedBy(owner string) bool { return owner != "" && l.Alias == owner }

// OpError is a failed operation on a link or its addresses.
type OpError struct {
	// Op is the operation, such as "add address".
	Op string
	// Object names the kernel object, such as "10.96.0.10 on lo".
	Object string
	// Err is the kernel's error.
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("%s %s: %v", e.Op, e.Object, e.Err) }

func (e *OpError) Unwrap() error { return e.Err }

// ifinfomsg returns a struct ifinfomsg for link index with flags (those
// of change).
func ifinfomsg(index int, flags, change uint32) []byte {
	b := []byte{unix.AF_UNSPEC, 0, 0, 0}
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint32(b, flags)
	return binary.NativeEndian.AppendUint32(b, change)
}

// LinkByName returns the link named name; ok is false when there is
// none.
func (c *Conn) LinkByName(ctx context.Context, name string) (l Link, ok bool, err error) {
	var b nl.Batch
	b.Message(unix.RTM_GETLINK, 0, ifinfomsg(0, 0, 0)...)
	b.String(unix.IFLA_IFNAME, name)
	err = c.c.Get(ctx, &b, func(typ uint16, data []byte) error {
		if typ == unix.RTM_NEWLINK {
			l, ok = parseLink(data)
		}
		return nil
	})
	if errors.Is(err, unix.ENODEV) {
		return Link{}, false, nil
	}
	if err != nil {
		return Link{}, false, &OpError{Op: "find link", Object: name, Err: err}
	}
	return l, ok, nil
}

// Links returns every link of the namespace, in the kernel's order.
func (c *Conn) Links(ctx context.Context) ([]Link, error) {
	var b nl.Batch
	b.Message(unix.RTM_GETLINK, 0, ifinfomsg(0, 0, 0)...)
	var out []Link
	err := nl.RetryInterrupted(ctx, func() error {
		out = out[:0]
		return c.c.Dump(ctx, &b, func(typ uint16, data []byte) error {
			if l, ok := parseLink(data); ok && typ == unix.RTM_NEWLINK {
				out = append(out, l)
			}
			return nil
		})
	})
	if err != nil {
		return nil, &OpError{Op: "list links", Object: "of the namespace", Err: err}
	}
	return out, nil
}

// parseLink reads an RTM_NEWLINK message.
func parseLink(data []byte) (Link, bool) {
	if len(data) < unix.SizeofIfInfomsg {
		return Link{}, false
	}
	l := Link{
		Index: int(int32(binary.NativeEndian.Uint32(data[4:8]))),
		Flags: binary.NativeEndian.Uint32(data[8:12]),
	}
	for typ, v := range nl.Attrs(data[unix.SizeofIfInfomsg:]) {
		switch typ {
		case unix.IFLA_IFNAME:
			l.Name = nl.CString(v)
		case unix.IFLA_IFALIAS:
			l.Alias = nl.CString(v)
		case unix.IFLA_LINKINFO:
			for typ, v := range nl.Attrs(v) {
				if typ == unix.IFLA_INFO_KIND {
					l.Kind = nl.CString(v)
				}
			}
		}
	}
	return l, l.Index > 0
}

// EnsureDummy returns the link named name, creating it as a dummy link
// marked as owner's (its alias) when there is none. A link of that name
// that exists is returned as it is, whatever its kind: the caller decides
// whether it serves. created reports that this call made it.
func (c *Conn) EnsureDummy(ctx context.Context, name, owner string) (l Link, created bool, err error) {
	l, ok, err := c.LinkByName(ctx, name)
	if err != nil || ok {
		return l, false, err
	}
	var b nl.Batch
	b.Message(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, ifinfomsg(0, 0, 0)...)
	b.String(unix.IFLA_IFNAME, name)
	b.Nest(unix.IFLA_LINKINFO)
	b.String(unix.IFLA_INFO_KIND, "dummy")
	b.End()
	switch err := c.send(ctx, &b); {
	case errors.Is(err, unix.EEXIST):
		// Made meanwhile by someone else: theirs.
	case err != nil:
		return Link{}, false, &OpError{Op: "add dummy link", Object: name, Err: err}
	default:
		created = true
	}
	if l, ok, err = c.LinkByName(ctx, name); err != nil {
		return Link{}, false, err
	}
	if !ok {
		return Link{}, false, &OpError{Op: "find link", Object: name, Err: errors.New("gone right after it was added")}
	}
	if created && owner != "" {
		if err := c.setLink(ctx, l.Index, 0, 0, owner); err != nil {
			// Unmarked, it would pass for someone else's.
			_ = c.deleteLink(ctx, l.Index)
			return Link{}, false, &OpError{Op: "mark link", Object: name, Err: err}
		}
		l.Alias = owner
	}
	return l, created, nil
}

// SetUp sets the link up.
func (c *Conn) SetUp(ctx context.Context, l Link) error {
	if err := c.setLink(ctx, l.Index, unix.IFF_UP, unix.IFF_UP, ""); err != nil {
		return &OpError{Op: "set link up", Object: l.Name, Err: err}
	}
	return nil
}

// setLink changes the flags of change to flags, and sets the alias
// unless it is empty.
func (c *Conn) setLink(ctx context.Context, index int, flags, change uint32, alias string) error {
	var b nl.Batch
	b.Message(unix.RTM_NEWLINK, 0, ifinfomsg(index, flags, change)...)
	if alias != "" {
		b.Attr(unix.IFLA_IFALIAS, []byte(alias))
	}
	return c.send(ctx, &b)
}

// RemoveDummy deletes the link named name, and with it its addresses,
// when it carries owner's mark; a link without it (someone else's) is
// left, and deleted is false. A missing link is no error.
func (c *Conn) RemoveDummy(ctx context.Context, name, owner string) (deleted bool, err error) {
	l, ok, err := c.LinkByName(ctx, name)
	if err != nil || !ok || !l.OwnedBy(owner) {
		return false, err
	}
	switch err := c.deleteLink(ctx, l.Index); {
	case errors.Is(err, unix.ENODEV):
		return false, nil
	case err != nil:
		return false, &OpError{Op: "delete dummy link", Object: name, Err: err}
	}
	return true, nil
}

func (c *Conn) deleteLink(ctx context.Context, index int) error {
	var b nl.Batch
	b.Message(unix.RTM_DELLINK, 0, ifinfomsg(index, 0, 0)...)
	return c.send(ctx, &b)
}
