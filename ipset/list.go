package ipset

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// SetInfo is a set as the kernel holds it.
type SetInfo struct {
	Set               // Name without the prefix
	Index      uint16 // the kernel's set index (iptables' set match refers to it)
	Revision   uint8  // the set type's revision
	Entries    uint32 // number of entries
	References uint32 // rules and list sets that refer to the set
}

// listed collects a list dump: set headers and entries, by kernel name.
type listed struct {
	order []string
	sets  map[string]*listedSet
}

type listedSet struct {
	info    SetInfo
	entries []Entry
}

// list dumps one set (name non-empty) or every set, headers only or with
// entries.
func (c *Client) list(ctx context.Context, name string, headerOnly bool) (*listed, error) {
	proto, err := c.lockedProto(ctx)
	defer c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	full := ""
	if name != "" {
		full = c.KernelName(name)
	}
	// A dump a concurrent change interrupted is read again.
	var l *listed
	err = nl.RetryInterrupted(ctx, func() error {
		l = &listed{sets: make(map[string]*listedSet)}
		return c.request(ctx, "list", full, cmdList, nl.Dump, 0, func(b *nl.Batch) {
			b.Uint8(attrProtocol, proto)
			if full != "" {
				putName(b, attrSetName, full)
			}
			if headerOnly {
				putU32(b, attrFlags, flagListHeader)
			}
		}, l.add)
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// add parses one message of a list dump. The first message of a set
// carries its header; every message carries its name and maybe entries.
func (l *listed) add(attrs []byte) error {
	var (
		ls       *listedSet
		adts     [][]byte
		header   []byte
		typeName string
		family   Family
		rev      uint8
		index    = -1
	)
	err := decode(attrs, func(d *nl.Decoder) {
		switch d.Type() {
		case attrSetName:
			name := d.String()
			if ls = l.sets[name]; ls == nil {
				ls = &listedSet{info: SetInfo{Set: Set{Name: name}}}
				l.sets[name] = ls
				l.order = append(l.order, name)
			}
		case attrTypeName:
			typeName = d.String()
		case attrFamily:
			family = Family(d.Uint8())
		case attrRevision:
			rev = d.Uint8()
		case attrIndex:
			index = int(d.Uint16())
		case attrData:
			header = d.Bytes()
		case attrADT:
			adts = append(adts, d.Bytes())
		}
	})
	if err != nil {
		return err
	}
	if ls == nil {
		return fmt.Errorf("list reply without a set name")
	}
	if typeName != "" {
		ls.info.Type, ls.info.Revision = Type(typeName), rev
		if ls.info.Type.hasFamily() {
			ls.info.Family = family
		}
		if index >= 0 {
			ls.info.Index = uint16(index)
		}
	}
	if header != nil {
		if err := parseHeader(header, &ls.info); err != nil {
			return fmt.Errorf("set %s header: %w", ls.info.Name, err)
		}
	}
	for _, b := range adts {
		if err := parseEntries(b, ls); err != nil {
			return fmt.Errorf("set %s entries: %w", ls.info.Name, err)
		}
	}
	return nil
}

func parseHeader(b []byte, info *SetInfo) error {
	ad := nl.NewDecoder(b)
	ad.Order = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case attrPort:
			info.PortFrom = ad.Uint16()
		case attrPortTo:
			info.PortTo = ad.Uint16()
		case attrHashSize:
			info.HashSize = ad.Uint32()
		case attrMaxElem:
			info.MaxElem = ad.Uint32()
		case attrTimeout:
			info.Timeout = time.Duration(ad.Uint32()) * time.Second
		case attrCadtFlags:
			f := ad.Uint32()
			info.Comment, info.Counters = f&cadtWithComment != 0, f&cadtWithCounters != 0
		case attrElements:
			info.Entries = ad.Uint32()
		case attrReferences:
			info.References = ad.Uint32()
		}
	}
	return ad.Err()
}

func parseEntries(b []byte, ls *listedSet) error {
	ad := nl.NewDecoder(b)
	for ad.Next() {
		if ad.Type() != attrData {
			continue
		}
		e, err := parseEntry(ad.Bytes(), ls.info.Type)
		if err != nil {
			return err
		}
		ls.entries = append(ls.entries, e)
	}
	return ad.Err()
}

func parseEntry(b []byte, t Type) (Entry, error) {
	ad := nl.NewDecoder(b)
	ad.Order = binary.BigEndian
	var e Entry
	var err error
	var ip, ip2 netip.Addr
	cidr, cidr2 := -1, -1
	for ad.Next() {
		switch ad.Type() {
		case attrIP:
			ip, err = readAddr(ad.Bytes())
		case attrIP2:
			ip2, err = readAddr(ad.Bytes())
		case attrCIDR:
			cidr = int(ad.Uint8())
		case attrCIDR2:
			cidr2 = int(ad.Uint8())
		case attrPort:
			e.Port = ad.Uint16()
		case attrProto:
			e.Protocol = Protocol(ad.Uint8())
		case attrTimeout:
			e.Timeout = time.Duration(ad.Uint32()) * time.Second
		case attrComment:
			e.Comment = ad.String()
		case attrPackets:
			e.Packets = ad.Uint64()
		case attrBytes:
			e.Bytes = ad.Uint64()
		}
		if err != nil {
			return Entry{}, err
		}
	}
	if err := ad.Err(); err != nil {
		return Entry{}, err
	}
	return assembleEntry(e, t, ip, ip2, cidr, cidr2)
}

// assembleEntry places the listed addresses in the fields the type uses.
func assembleEntry(e Entry, t Type, ip, ip2 netip.Addr, cidr, cidr2 int) (Entry, error) {
	prefix := func(a netip.Addr, bits int) (netip.Prefix, error) {
		if bits < 0 {
			bits = a.BitLen()
		}
		p := netip.PrefixFrom(a, bits)
		if !p.IsValid() {
			return p, fmt.Errorf("bad network %v/%d", a, bits)
		}
		return p, nil
	}
	var err error
	switch t {
	case HashNet:
		e.Net, err = prefix(ip, cidr)
	case HashIPPortNet:
		e.IP = ip
		e.Net, err = prefix(ip2, cidr2)
	case BitmapPort:
		e.Protocol = 0
	default:
		e.IP, e.IP2 = ip, ip2
	}
	return e, err
}

// List returns the client's sets (those whose names carry its prefix),
// with their headers, in the kernel's order.
func (c *Client) List(ctx context.Context) ([]SetInfo, error) {
	l, err := c.list(ctx, "", true)
	if err != nil {
		return nil, err
	}
	var out []SetInfo
	for _, full := range l.order {
		if name, ok := c.owns(full); ok {
			info := l.sets[full].info
			info.Name = name
			out = append(out, info)
		}
	}
	return out, nil
}

// Get returns one set's header (ErrNotExist if there is no such set).
func (c *Client) Get(ctx context.Context, name string) (*SetInfo, error) {
	info, _, err := c.get(ctx, name, true)
	return info, err
}

// Entries returns a set's header and entries. An entry's Timeout is its
// remaining lifetime.
func (c *Client) Entries(ctx context.Context, name string) (*SetInfo, []Entry, error) {
	return c.get(ctx, name, false)
}

func (c *Client) get(ctx context.Context, name string, headerOnly bool) (*SetInfo, []Entry, error) {
	if err := validateName(c.prefix, name); err != nil {
		return nil, nil, err
	}
	l, err := c.list(ctx, name, headerOnly)
	if err != nil {
		return nil, nil, err
	}
	ls := l.sets[c.KernelName(name)]
	if ls == nil || ls.info.Type == "" {
		return nil, nil, &OpError{Op: "list", Set: c.KernelName(name), Err: ErrNotExist}
	}
	info := ls.info
	info.Name = name
	return &info, ls.entries, nil
}

// Index returns the kernel's index of a set, which iptables' set match
// (xt_set) carries in place of the name. It is per namespace, and changes
// when the set is destroyed and created again.
func (c *Client) Index(ctx context.Context, name string) (uint16, error) {
	info, err := c.Get(ctx, name)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	proto := c.proto
	c.mu.Unlock()
	if proto < protocolIndex {
		return 0, &OpError{Op: "list", Set: c.KernelName(name),
			Err: fmt.Errorf("%w: kernel ipset protocol %d does not report set indexes", ErrNotSupported, proto)}
	}
	return info.Index, nil
}
