package ipset

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Type is an ipset set type.
type Type string

// The set types kproxy's IPVS mode uses.
const (
	HashIP        Type = "hash:ip"          // IP
	HashIPPort    Type = "hash:ip,port"     // IP, protocol and port
	HashIPPortIP  Type = "hash:ip,port,ip"  // IP, protocol, port and a second IP
	HashIPPortNet Type = "hash:ip,port,net" // IP, protocol, port and a network
	HashNet       Type = "hash:net"         // a network
	BitmapPort    Type = "bitmap:port"      // a port in a range
)

// fields says which Entry fields a type uses.
type fields struct{ ip, port, ip2, net bool }

var typeFields = map[Type]fields{
	HashIP:        {ip: true},
	HashIPPort:    {ip: true, port: true},
	HashIPPortIP:  {ip: true, port: true, ip2: true},
	HashIPPortNet: {ip: true, port: true, net: true},
	HashNet:       {net: true},
	BitmapPort:    {port: true},
}

func (t Type) valid() bool { _, ok := typeFields[t]; return ok }

// hasFamily reports whether sets of the type hold addresses of one family.
func (t Type) hasFamily() bool { return t != BitmapPort }

// Family is a set's address family.
type Family uint8

// Families, as the kernel numbers them (AF_INET, AF_INET6).
const (
	IPv4 Family = 2  // "inet"
	IPv6 Family = 10 // "inet6"
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "inet"
	case IPv6:
		return "inet6"
	case 0:
		return "none"
	}
	return "family(" + strconv.Itoa(int(f)) + ")"
}

func (f Family) holds(a netip.Addr) bool {
	return (f == IPv4 && a.Is4()) || (f == IPv6 && a.Is6() && !a.Is4In6())
}

// Protocol is the layer-4 protocol of a port entry.
type Protocol uint8

// Protocols of port entries.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// Set describes a set. Name is the name without the client's prefix.
type Set struct {
	Name   string
	Type   Type
	Family Family // IPv4 or IPv6 for hash types; zero for bitmap:port

	// Timeout is the default lifetime of entries; zero means entries do
	// not expire and may not carry a timeout. Whole seconds.
	Timeout  time.Duration
	Comment  bool   // entries may carry a comment
	Counters bool   // entries count packets and bytes
	MaxElem  uint32 // hash types: maximum number of entries (0 = kernel default, 65536)
	HashSize uint32 // hash types: initial hash size (0 = kernel default, 1024)

	// PortFrom and PortTo are the range of a bitmap:port set (inclusive).
	PortFrom, PortTo uint16
}

// Entry is one member of a set. Which fields it uses depends on the set
// type; the others must be zero:
//
//	hash:ip           IP
//	hash:ip,port      IP, Protocol, Port
//	hash:ip,port,ip   IP, Protocol, Port, IP2
//	hash:ip,port,net  IP, Protocol, Port, Net
//	hash:net          Net
//	bitmap:port       Port
//
// Timeout (whole seconds; zero = the set's default) needs a set with a
// timeout, Comment a set with comments. When listed, Timeout is the
// remaining lifetime and Packets and Bytes are the counters (sets with
// Counters).
type Entry struct {
	IP       netip.Addr
	Protocol Protocol
	Port     uint16
	IP2      netip.Addr
	Net      netip.Prefix

	Timeout time.Duration
	Comment string

	Packets, Bytes uint64 // read only
}

// String renders the entry's members as `ipset` does ("10.0.0.1,tcp:80").
func (e Entry) String() string {
	var parts []string
	if e.IP.IsValid() {
		parts = append(parts, e.IP.String())
	}
	if e.Protocol != 0 {
		parts = append(parts, e.Protocol.String()+":"+strconv.Itoa(int(e.Port)))
	} else if e.Port != 0 {
		parts = append(parts, strconv.Itoa(int(e.Port)))
	}
	if e.IP2.IsValid() {
		parts = append(parts, e.IP2.String())
	}
	if e.Net.IsValid() {
		parts = append(parts, e.Net.String())
	}
	return strings.Join(parts, ",")
}

// key identifies an entry within a set: its members, without timeout,
// comment or counters.
type key struct {
	ip       netip.Addr
	protocol Protocol
	port     uint16
	ip2      netip.Addr
	net      netip.Prefix
}

func (e Entry) key() key {
	return key{ip: e.IP, protocol: e.Protocol, port: e.Port, ip2: e.IP2, net: e.Net}
}

// validateSet checks a set description before it reaches the kernel.
func validateSet(prefix string, s Set) error {
	if err := validateName(prefix, s.Name); err != nil {
		return err
	}
	bad := func(format string, a ...any) error {
		return &SetError{Set: s.Name, Reason: fmt.Sprintf(format, a...)}
	}
	if !s.Type.valid() {
		return bad("unsupported type %q", s.Type)
	}
	switch {
	case s.Type.hasFamily() && s.Family != IPv4 && s.Family != IPv6:
		return bad("%s needs family IPv4 or IPv6, not %v", s.Type, s.Family)
	case !s.Type.hasFamily() && s.Family != 0:
		return bad("%s has no family (got %v)", s.Type, s.Family)
	case s.Timeout < 0 || s.Timeout > maxTimeout || s.Timeout%time.Second != 0:
		return bad("timeout %v: want whole seconds up to %v", s.Timeout, maxTimeout)
	case s.Type == BitmapPort && s.PortFrom > s.PortTo:
		return bad("port range %d-%d is reversed", s.PortFrom, s.PortTo)
	case s.Type == BitmapPort && s.PortTo == 0:
		return bad("bitmap:port needs a port range (PortFrom, PortTo)")
	case s.Type != BitmapPort && (s.PortFrom != 0 || s.PortTo != 0):
		return bad("a port range applies to bitmap:port only")
	case s.Type == BitmapPort && (s.MaxElem != 0 || s.HashSize != 0):
		return bad("MaxElem and HashSize apply to hash types only")
	}
	return nil
}

// validateName checks a set name with the prefix against the kernel's
// 31-byte limit.
func validateName(prefix, name string) error {
	full := prefix + name
	switch {
	case name == "":
		return &SetError{Set: name, Reason: "empty set name"}
	case len(full) > maxNameLen:
		return &SetError{Set: name, Reason: fmt.Sprintf("name %q with prefix is %d bytes, the kernel allows %d", full, len(full), maxNameLen)}
	case strings.ContainsAny(full, "\x00 \t\n"):
		return &SetError{Set: name, Reason: "set name contains NUL or white space"}
	}
	return nil
}

// validateEntry checks that e fits set s, and returns it in canonical form
// (IPv4 addresses unmapped, networks masked).
func validateEntry(s *Set, e Entry) (Entry, error) {
	f := typeFields[s.Type]
	bad := func(format string, a ...any) (Entry, error) {
		return Entry{}, &EntryError{Set: s.Name, Entry: e, Reason: fmt.Sprintf(format, a...)}
	}
	e.IP, e.IP2 = e.IP.Unmap(), e.IP2.Unmap()
	if e.Net.IsValid() {
		e.Net = netip.PrefixFrom(e.Net.Addr().Unmap(), e.Net.Bits()-unmapBits(e.Net)).Masked()
	}
	switch {
	case f.ip != e.IP.IsValid():
		return bad("%s %s", s.Type, needs(f.ip, "an IP", "IP"))
	case f.ip2 != e.IP2.IsValid():
		return bad("%s %s", s.Type, needs(f.ip2, "a second IP", "second IP"))
	case f.net != e.Net.IsValid():
		return bad("%s %s", s.Type, needs(f.net, "a network", "network"))
	case !f.port && (e.Port != 0 || e.Protocol != 0):
		return bad("%s takes no port or protocol", s.Type)
	case f.port && s.Type != BitmapPort && e.Protocol != TCP && e.Protocol != UDP && e.Protocol != SCTP:
		return bad("protocol %v: want tcp, udp or sctp", e.Protocol)
	case s.Type == BitmapPort && e.Protocol != 0:
		return bad("bitmap:port takes no protocol")
	case s.Type == BitmapPort && (e.Port < s.PortFrom || e.Port > s.PortTo):
		return bad("port %d is outside the set's range %d-%d", e.Port, s.PortFrom, s.PortTo)
	}
	for _, a := range []netip.Addr{e.IP, e.IP2, e.Net.Addr()} {
		if a.IsValid() && !s.Family.holds(a) {
			return bad("address %v is not %v", a, s.Family)
		}
	}
	return validateExtensions(s, e)
}

func validateExtensions(s *Set, e Entry) (Entry, error) {
	bad := func(format string, a ...any) (Entry, error) {
		return Entry{}, &EntryError{Set: s.Name, Entry: e, Reason: fmt.Sprintf(format, a...)}
	}
	switch {
	case e.Net.IsValid() && e.Net.Bits() == 0:
		return bad("network %v: the kernel refuses a zero prefix length", e.Net)
	case e.Timeout != 0 && s.Timeout == 0:
		return bad("timeout given, but the set has no timeout")
	case e.Timeout < 0 || e.Timeout > maxTimeout || e.Timeout%time.Second != 0:
		return bad("timeout %v: want whole seconds up to %v", e.Timeout, maxTimeout)
	case e.Comment != "" && !s.Comment:
		return bad("comment given, but the set has no comments")
	case len(e.Comment) > maxCommentLen || strings.ContainsRune(e.Comment, 0):
		return bad("comment: at most %d bytes, no NUL", maxCommentLen)
	case e.Packets != 0 || e.Bytes != 0:
		return bad("packet and byte counters are read only")
	}
	return e, nil
}

// unmapBits is how many bits an IPv4-mapped IPv6 prefix loses when unmapped.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

func needs(yes bool, a, none string) string {
	if yes {
		return "needs " + a
	}
	return "takes no " + none
}
