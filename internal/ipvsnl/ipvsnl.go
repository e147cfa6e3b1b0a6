//go:build linux

package ipvsnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"golang.org/x/sys/unix"
)

// IPVS's generic netlink family (linux/ip_vs.h).
const (
	familyName = "IPVS"
	version    = 1 // IPVS_GENL_VERSION
)

// Commands.
const (
	cmdNewService = 1
	cmdSetService = 2
	cmdDelService = 3
	cmdGetService = 4
	cmdNewDest    = 5
	cmdSetDest    = 6
	cmdDelDest    = 7
	cmdGetDest    = 8
	cmdGetInfo    = 15 // IPVS_CMD_GET_INFO
)

// Attributes of a command.
const (
	attrService = 1 // IPVS_CMD_ATTR_SERVICE
	attrDest    = 2 // IPVS_CMD_ATTR_DEST
)

// Attributes of a service.
const (
	svcAF        = 1
	svcProtocol  = 2
	svcAddr      = 3
	svcPort      = 4
	svcFWMark    = 5
	svcSchedName = 6
	svcFlags     = 7
	svcTimeout   = 8
	svcNetmask   = 9
)

// Attributes of a destination.
const (
	destAddr         = 1
	destPort         = 2
	destFwdMethod    = 3
	destWeight       = 4
	destUThresh      = 5
	destLThresh      = 6
	destActiveConns  = 7
	destInactConns   = 8
	destPersistConns = 9
	destAddrFamily   = 11
)

// Service flags (IP_VS_SVC_F_*).
const (
	FlagPersistent = 0x1  // IP_VS_SVC_F_PERSISTENT: ClientIP affinity
	FlagSched2     = 0x10 // IP_VS_SVC_F_SCHED2: sh-port, mh-port
	// flagHashed (IP_VS_SVC_F_HASHED) is the kernel's own: a service
	// in its table. Services leaves it out.
	flagHashed = 0x2
)

// Forwarding methods (IP_VS_CONN_F_*).
const (
	Masquerade  = 0 // IP_VS_CONN_F_MASQ: NAT
	LocalNode   = 1
	Tunnel      = 2
	DirectRoute = 3
)

// ErrNotAvailable: the kernel has no IPVS generic netlink family.
var ErrNotAvailable = errors.New("ipvs generic netlink family not available (is the ip_vs module loaded?)")

// Service is a virtual server as IPVS holds it. An address service has
// Protocol, Addr and Port; a firewall-mark one FWMark (and no address).
type Service struct {
	Family    uint16 // unix.AF_INET or unix.AF_INET6
	Protocol  uint16 // unix.IPPROTO_TCP, ...
	Addr      netip.Addr
	Port      uint16
	FWMark    uint32
	Scheduler string
	Flags     uint32 // FlagPersistent, FlagSched2, ...
	Timeout   uint32 // persistence, in seconds
	Netmask   uint32 // persistence granularity: 0xffffffff or 128 for one client
}

// Dest is a real server of a virtual server.
type Dest struct {
	Addr      netip.Addr
	Port      uint16
	FwdMethod uint32
	Weight    int32
	// UpperThreshold and LowerThreshold bound its connections; zero is
	// no bound.
	UpperThreshold, LowerThreshold uint32
	// The connection counts, as read back.
	ActiveConns, InactiveConns, PersistConns uint32
}

// Options configure a Conn.
type Options struct {
	// NetNS is a file descriptor of the network namespace to talk to;
	// zero or negative means the caller's.
	NetNS int
}

// Conn is a generic netlink socket talking to IPVS in one namespace. Its
// methods are safe for concurrent use; they run one at a time.
type Conn struct {
	c      *nl.Conn
	family uint16
}

// Open opens a Conn and looks up IPVS's family.
func Open(ctx context.Context, o Options) (*Conn, error) {
	c, err := nl.Open(unix.NETLINK_GENERIC, nl.Options{NetNS: o.NetNS})
	if err != nil {
		return nil, err
	}
	id, err := familyID(ctx, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Conn{c: c, family: id}, nil
}

// familyID asks generic netlink's controller for IPVS's family.
func familyID(ctx context.Context, c *nl.Conn) (uint16, error) {
	var b nl.Batch
	b.Message(unix.GENL_ID_CTRL, 0, unix.CTRL_CMD_GETFAMILY, 1, 0, 0)
	b.String(unix.CTRL_ATTR_FAMILY_NAME, familyName)
	var id uint16
	err := c.Get(ctx, &b, func(_ uint16, data []byte) error {
		if len(data) < unix.GENL_HDRLEN {
			return nil
		}
		for typ, v := range nl.Attrs(data[unix.GENL_HDRLEN:]) {
			if typ == unix.CTRL_ATTR_FAMILY_ID && len(v) >= 2 {
				id = binary.NativeEndian.Uint16(v)
			}
		}
		return nil
	})
	if errors.Is(err, unix.ENOENT) {
		return 0, fmt.Errorf("%w: %v", ErrNotAvailable, err)
	}
	if err != nil {
		return 0, fmt.Errorf("look up generic netlink family %s: %w", familyName, err)
	}
	if id == 0 {
		return 0, fmt.Errorf("%w: no family identifier in the controller's answer", ErrNotAvailable)
	}
	return id, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// Stats returns what the Conn sent so far.
func (c *Conn) Stats() nl.Stats { return c.c.Stats() }

// Batch returns an empty batch of IPVS requests for c.
func (c *Conn) Batch() *Batch { return &Batch{family: c.family} }

// Send writes the batch, many requests to a system call, and returns the
// error of each request in the order they were added (nil for success;
// an *nl.Error wrapping the errno for a refusal). A non-nil error
// means that Send stopped part way; see nl.Conn.Send.
func (c *Conn) Send(ctx context.Context, b *Batch) ([]error, error) {
	return c.c.Send(ctx, &b.b)
}

// Batch is a list of IPVS requests. Its methods never fail.
type Batch struct {
	family uint16
	b      nl.Batch
}

// Len returns the number of requests.
func (b *Batch) Len() int { return b.b.Len() }

// Reset empties the batch, keeping its memory.
func (b *Batch) Reset() { b.b.Reset() }

// NewService adds a request that creates s.
func (b *Batch) NewService(s *Service) { b.service(cmdNewService, s, true) }

// SetService adds a request that changes s's scheduler, flags, timeout
// and netmask.
func (b *Batch) SetService(s *Service) { b.service(cmdSetService, s, true) }

// DelService adds a request that deletes s with its real servers.
func (b *Batch) DelService(s *Service) { b.service(cmdDelService, s, false) }

// NewDest adds a request that adds d to s.
func (b *Batch) NewDest(s *Service, d *Dest) { b.dest(cmdNewDest, s, d, true) }

// SetDest adds a request that changes d's forwarding method, weight and
// thresholds in s.
func (b *Batch) SetDest(s *Service, d *Dest) { b.dest(cmdSetDest, s, d, true) }

// DelDest adds a request that removes d from s.
func (b *Batch) DelDest(s *Service, d *Dest) { b.dest(cmdDelDest, s, d, false) }

func (b *Batch) header(cmd uint8, flags uint16) {
	b.b.Message(b.family, flags, cmd, version, 0, 0)
}

func (b *Batch) service(cmd uint8, s *Service, full bool) {
	b.header(cmd, 0)
	putService(&b.b, s, full)
}

func (b *Batch) dest(cmd uint8, s *Service, d *Dest, full bool) {
	b.header(cmd, 0)
	putService(&b.b, s, false)
	b.b.Nest(attrDest)
	b.b.Addr(destAddr, d.Addr)
	b.b.BigEndian16(destPort, d.Port)
	if full {
		b.b.Uint32(destFwdMethod, d.FwdMethod)
		b.b.Uint32(destWeight, uint32(d.Weight))
		b.b.Uint32(destUThresh, d.UpperThreshold)
		b.b.Uint32(destLThresh, d.LowerThreshold)
	}
	b.b.Uint16(destAddrFamily, addrFamily(d.Addr))
	b.b.End()
}

// putService adds the service attribute: the key (family, and firewall
// mark or protocol, address and port), and with full its settings.
func putService(b *nl.Batch, s *Service, full bool) {
	b.Nest(attrService)
	b.Uint16(svcAF, s.Family)
	if s.FWMark != 0 {
		b.Uint32(svcFWMark, s.FWMark)
	} else {
		b.Uint16(svcProtocol, s.Protocol)
		b.Addr(svcAddr, s.Addr)
		b.BigEndian16(svcPort, s.Port)
	}
	if full {
		b.String(svcSchedName, s.Scheduler)
		var flags [8]byte // struct ip_vs_flags: flags and the mask of those set
		binary.NativeEndian.PutUint32(flags[:], s.Flags)
		binary.NativeEndian.PutUint32(flags[4:], 0xffffffff)
		b.Attr(svcFlags, flags[:])
		b.Uint32(svcTimeout, s.Timeout)
		b.Uint32(svcNetmask, s.Netmask)
	}
	b.End()
}

func addrFamily(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// Info asks IPVS for its version and connection table size, and discards
// the answer: a request that changes nothing and that the kernel answers
// only with CAP_NET_ADMIN in the namespace, as every IPVS request.
func (c *Conn) Info(ctx context.Context) error {
	b := c.Batch()
	b.header(cmdGetInfo, 0)
	if err := c.c.Get(ctx, &b.b, func(uint16, []byte) error { return nil }); err != nil {
		return fmt.Errorf("get ipvs info: %w", err)
	}
	return nil
}

// Services returns every virtual server of the namespace.
func (c *Conn) Services(ctx context.Context) ([]Service, error) {
	b := c.Batch()
	b.header(cmdGetService, 0)
	var out []Service
	err := c.c.Dump(ctx, &b.b, func(_ uint16, data []byte) error {
		for typ, v := range commandAttrs(data) {
			if typ == attrService {
				out = append(out, parseService(v))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list virtual servers: %w", err)
	}
	return out, nil
}

// Service looks up the virtual server with s's key, and reports whether
// it exists.
func (c *Conn) Service(ctx context.Context, s *Service) (Service, bool, error) {
	b := c.Batch()
	b.header(cmdGetService, 0)
	putService(&b.b, s, false)
	var out Service
	found := false
	err := c.c.Get(ctx, &b.b, func(_ uint16, data []byte) error {
		for typ, v := range commandAttrs(data) {
			if typ == attrService {
				out, found = parseService(v), true
			}
		}
		return nil
	})
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENOENT) {
		return Service{}, false, nil
	}
	if err != nil {
		return Service{}, false, fmt.Errorf("look up virtual server: %w", err)
	}
	return out, found, nil
}

// Dests returns the real servers of s.
func (c *Conn) Dests(ctx context.Context, s *Service) ([]Dest, error) {
	b := c.Batch()
	b.header(cmdGetDest, 0)
	putService(&b.b, s, false)
	var out []Dest
	err := c.c.Dump(ctx, &b.b, func(_ uint16, data []byte) error {
		for typ, v := range commandAttrs(data) {
			if typ == attrDest {
				out = append(out, parseDest(v, s.Family))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list real servers: %w", err)
	}
	return out, nil
}

// commandAttrs iterates over the attributes after a message's generic
// netlink header.
func commandAttrs(data []byte) iter.Seq2[uint16, []byte] {
	if len(data) < unix.GENL_HDRLEN {
		return func(func(uint16, []byte) bool) {}
	}
	return nl.Attrs(data[unix.GENL_HDRLEN:])
}

func parseService(b []byte) Service {
	var s Service
	var addr []byte
	for typ, v := range nl.Attrs(b) {
		switch typ {
		case svcAF:
			s.Family = u16(v)
		case svcProtocol:
			s.Protocol = u16(v)
		case svcAddr:
			addr = v
		case svcPort:
			if len(v) >= 2 {
				s.Port = binary.BigEndian.Uint16(v)
			}
		case svcFWMark:
			s.FWMark = u32(v)
		case svcSchedName:
			s.Scheduler = cstring(v)
		case svcFlags:
			s.Flags = u32(v) &^ flagHashed
		case svcTimeout:
			s.Timeout = u32(v)
		case svcNetmask:
			s.Netmask = u32(v)
		}
	}
	if s.FWMark == 0 {
		s.Addr = addrOf(addr, s.Family)
	}
	return s
}

func parseDest(b []byte, fam uint16) Dest {
	var d Dest
	var addr []byte
	for typ, v := range nl.Attrs(b) {
		switch typ {
		case destAddr:
			addr = v
		case destPort:
			if len(v) >= 2 {
				d.Port = binary.BigEndian.Uint16(v)
			}
		case destFwdMethod:
			d.FwdMethod = u32(v)
		case destWeight:
			d.Weight = int32(u32(v))
		case destUThresh:
			d.UpperThreshold = u32(v)
		case destLThresh:
			d.LowerThreshold = u32(v)
		case destActiveConns:
			d.ActiveConns = u32(v)
		case destInactConns:
			d.InactiveConns = u32(v)
		case destPersistConns:
			d.PersistConns = u32(v)
		case destAddrFamily:
			fam = u16(v)
		}
	}
	d.Addr = addrOf(addr, fam)
	return d
}

// addrOf reads an address of family fam: the kernel sends a union of 16
// bytes, an IPv4 address in its first 4.
func addrOf(b []byte, fam uint16) netip.Addr {
	switch {
	case fam == unix.AF_INET && len(b) >= 4:
		return netip.AddrFrom4([4]byte(b[:4]))
	case fam == unix.AF_INET6 && len(b) >= 16:
		return netip.AddrFrom16([16]byte(b[:16]))
	}
	return netip.Addr{}
}

func u16(b []byte) uint16 {
	if len(b) < 2 {
		return 0
	}
	return binary.NativeEndian.Uint16(b)
}

func u32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
