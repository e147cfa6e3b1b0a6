//go:build linux

package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
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

// ifinfomsg appends a struct ifinfomsg for link index with flags (those
// of change).
func ifinfomsg(b []byte, index int, flags, change uint32) []byte {
	b = append(b, unix.AF_UNSPEC, 0, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint32(b, flags)
	return binary.NativeEndian.AppendUint32(b, change)
}

func cstring(s string) []byte { return append([]byte(s), 0) }

// LinkByName returns the link named name; ok is false when there is
// none.
func (c *Conn) LinkByName(name string) (l Link, ok bool, err error) {
	b, at := c.header(nil, unix.RTM_GETLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	b = ifinfomsg(b, 0, 0, 0)
	b = attr(b, unix.IFLA_IFNAME, cstring(name))
	err = c.request(finish(b, at), func(m syscall.NetlinkMessage) {
		if m.Header.Type == unix.RTM_NEWLINK {
			l, ok = parseLink(m.Data)
		}
	})
	if errors.Is(err, unix.ENODEV) {
		return Link{}, false, nil
	}
	if err != nil {
		return Link{}, false, &OpError{Op: "find link", Object: name, Err: err}
	}
	return l, ok, nil
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
	attrs(data[unix.SizeofIfInfomsg:], func(typ uint16, v []byte) {
		switch typ {
		case unix.IFLA_IFNAME:
			l.Name = trimNUL(v)
		case unix.IFLA_IFALIAS:
			l.Alias = trimNUL(v)
		case unix.IFLA_LINKINFO:
			attrs(v, func(typ uint16, v []byte) {
				if typ == unix.IFLA_INFO_KIND {
					l.Kind = trimNUL(v)
				}
			})
		}
	})
	return l, l.Index > 0
}

func trimNUL(v []byte) string {
	for i, c := range v {
		if c == 0 {
			return string(v[:i])
		}
	}
	return string(v)
}

// EnsureDummy returns the link named name, creating it as a dummy link
// marked as owner's (its alias) when there is none. A link of that name
// that exists is returned as it is, whatever its kind: the caller decides
// whether it serves. created reports that this call made it.
func (c *Conn) EnsureDummy(name, owner string) (l Link, created bool, err error) {
	l, ok, err := c.LinkByName(name)
	if err != nil || ok {
		return l, false, err
	}
	b, at := c.header(nil, unix.RTM_NEWLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	b = ifinfomsg(b, 0, 0, 0)
	b = attr(b, unix.IFLA_IFNAME, cstring(name))
	b = attr(b, unix.IFLA_LINKINFO, attr(nil, unix.IFLA_INFO_KIND, cstring("dummy")))
	switch err := c.request(finish(b, at), nil); {
	case errors.Is(err, unix.EEXIST):
		// Made meanwhile by someone else: theirs.
	case err != nil:
		return Link{}, false, &OpError{Op: "add dummy link", Object: name, Err: err}
	default:
		created = true
	}
	if l, ok, err = c.LinkByName(name); err != nil {
		return Link{}, false, err
	}
	if !ok {
		return Link{}, false, &OpError{Op: "find link", Object: name, Err: errors.New("gone right after it was added")}
	}
	if created && owner != "" {
		if err := c.setLink(l.Index, 0, 0, attr(nil, unix.IFLA_IFALIAS, []byte(owner))); err != nil {
			// Unmarked, it would pass for someone else's.
			_ = c.deleteLink(l.Index)
			return Link{}, false, &OpError{Op: "mark link", Object: name, Err: err}
		}
		l.Alias = owner
	}
	return l, created, nil
}

// SetUp sets the link up.
func (c *Conn) SetUp(l Link) error {
	if err := c.setLink(l.Index, unix.IFF_UP, unix.IFF_UP, nil); err != nil {
		return &OpError{Op: "set link up", Object: l.Name, Err: err}
	}
	return nil
}

func (c *Conn) setLink(index int, flags, change uint32, attrs []byte) error {
	b, at := c.header(nil, unix.RTM_NEWLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	b = ifinfomsg(b, index, flags, change)
	b = append(b, attrs...)
	return c.request(finish(b, at), nil)
}

// RemoveDummy deletes the link named name, and with it its addresses,
// when it carries owner's mark; a link without it (someone else's) is
// left, and deleted is false. A missing link is no error.
func (c *Conn) RemoveDummy(name, owner string) (deleted bool, err error) {
	l, ok, err := c.LinkByName(name)
	if err != nil || !ok || !l.OwnedBy(owner) {
		return false, err
	}
	switch err := c.deleteLink(l.Index); {
	case errors.Is(err, unix.ENODEV):
		return false, nil
	case err != nil:
		return false, &OpError{Op: "delete dummy link", Object: name, Err: err}
	}
	return true, nil
}

func (c *Conn) deleteLink(index int) error {
	b, at := c.header(nil, unix.RTM_DELLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	b = ifinfomsg(b, index, 0, 0)
	return c.request(finish(b, at), nil)
}
