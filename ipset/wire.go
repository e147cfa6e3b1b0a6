package ipset

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// The ipset netlink protocol (include/uapi/linux/netfilter/ipset/ip_set.h).
const (
	netlinkNetfilter = 12 // NETLINK_NETFILTER
	subsysIPSet      = 6  // NFNL_SUBSYS_IPSET

	protocolMin   = 6 // the oldest protocol the kernel accepts
	protocolIndex = 7 // the protocol whose list replies carry the set index

	maxNameLen    = 31 // IPSET_MAXNAMELEN without the NUL
	maxCommentLen = 255
	maxTimeout    = 2147483 * time.Second // IPSET_MAX_TIMEOUT
)

// Commands.
const (
	cmdProtocol = 1
	cmdCreate   = 2
	cmdDestroy  = 3
	cmdFlush    = 4
	cmdList     = 7
	cmdAdd      = 9
	cmdDel      = 10
	cmdTest     = 11
	cmdType     = 13
)

// Attributes at command level.
const (
	attrProtocol    = 1
	attrSetName     = 2
	attrTypeName    = 3
	attrRevision    = 4
	attrFamily      = 5
	attrFlags       = 6
	attrData        = 7
	attrADT         = 8
	attrLineNo      = 9  // required with attrADT
	attrProtocolMin = 10 // also the minimal revision in TYPE replies
	attrIndex       = 11
)

// Attributes inside attrData: create, list header and entries (CADT), then
// create-only, then entry-only (ADT).
const (
	attrIP         = 1
	attrCIDR       = 3
	attrPort       = 4
	attrPortTo     = 5
	attrTimeout    = 6
	attrProto      = 7
	attrCadtFlags  = 8
	attrHashSize   = 18
	attrMaxElem    = 19
	attrElements   = 24
	attrReferences = 25
	attrIP2        = 20
	attrCIDR2      = 21
	attrBytes      = 24
	attrPackets    = 25
	attrComment    = 26

	attrIPAddrIPv4 = 1
	attrIPAddrIPv6 = 2
)

// Flags.
const (
	flagListHeader = 1 << 2 // IPSET_FLAG_LIST_HEADER, in attrFlags

	cadtWithCounters = 1 << 3 // IPSET_FLAG_WITH_COUNTERS, in attrCadtFlags
	cadtWithComment  = 1 << 4 // IPSET_FLAG_WITH_COMMENT

)

// Kernel error numbers of ipset (above the errno range).
const (
	errProtocol      = 4097
	errFindType      = 4098
	errMaxSets       = 4099
	errBusy          = 4100
	errExistSetName2 = 4101
	errTypeMismatch  = 4102
	errExist         = 4103
	errInvalidCIDR   = 4104
	errInvalidFamily = 4106
	errTimeout       = 4107
	errReferenced    = 4108
	errCounter       = 4111
	errComment       = 4112
	errHashFull      = 4352
	errHashElem      = 4353
	errInvalidProto  = 4354
	errMissingProto  = 4355
)

// kernelErrors describes ipset's private error numbers.
var kernelErrors = map[int]string{
	errProtocol:      "protocol error (kernel and request disagree on the ipset protocol)",
	errFindType:      "set type not supported by the kernel",
	errMaxSets:       "the kernel's maximum number of sets is reached",
	errBusy:          "set is busy",
	errExistSetName2: "the second set does not exist",
	errTypeMismatch:  "set types differ",
	errExist:         "element or set already exists, or does not exist",
	errInvalidCIDR:   "invalid prefix length",
	errInvalidFamily: "invalid address family",
	errTimeout:       "timeout given for a set created without timeout",
	errReferenced:    "set is referenced by a rule or another set",
	errCounter:       "counters given for a set created without counters",
	errComment:       "comment given for a set created without comments",
	errHashFull:      "set is full, or (bitmap types) element out of range",
	errHashElem:      "null-valued element, or (bitmap types) range too large",
	errInvalidProto:  "invalid protocol",
	errMissingProto:  "protocol missing",
}

// The attributes of a request: values in network byte order, flagged so.
func putU32(b *nl.Batch, typ uint16, v uint32) { b.BigEndian32(typ|nl.NetByteOrder, v) }
func putU16(b *nl.Batch, typ uint16, v uint16) { b.BigEndian16(typ|nl.NetByteOrder, v) }

func putName(b *nl.Batch, typ uint16, s string) { b.String(typ, s) }

// The entries of an add or delete are many (a hundred thousand endpoints'
// loop-back entries at a cold sync): they are appended to the message's
// bytes directly, in internal/nl's framing, with no allocation per entry.

func appendU8(b []byte, typ uint16, v uint8) []byte {
	return nl.Pad(append(nl.AppendAttrHeader(b, typ, 1), v))
}

func appendU16(b []byte, typ, v uint16) []byte {
	return nl.Pad(binary.BigEndian.AppendUint16(nl.AppendAttrHeader(b, typ|nl.NetByteOrder, 2), v))
}

func appendU32(b []byte, typ uint16, v uint32) []byte {
	return binary.BigEndian.AppendUint32(nl.AppendAttrHeader(b, typ|nl.NetByteOrder, 4), v)
}

func appendString(b []byte, typ uint16, s string) []byte {
	return nl.Pad(append(append(nl.AppendAttrHeader(b, typ, len(s)+1), s...), 0))
}

// appendIPAddr appends the attribute inside an IPADDR nest.
func appendIPAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(nl.AppendAttrHeader(b, attrIPAddrIPv4|nl.NetByteOrder, 4), v[:]...)
	}
	v := a.As16()
	return append(nl.AppendAttrHeader(b, attrIPAddrIPv6|nl.NetByteOrder, 16), v[:]...)
}

// appendAddr appends an address as ipset's nested IPADDR attribute.
func appendAddr(b []byte, typ uint16, a netip.Addr) []byte {
	b, at := nl.AppendNest(b, typ)
	b = appendIPAddr(b, a)
	nl.EndNest(b, at)
	return b
}

// readAddr decodes a nested IPADDR attribute.
func readAddr(b []byte) (netip.Addr, error) {
	var a netip.Addr
	d := nl.NewDecoder(b)
	for d.Next() {
		switch d.Type() {
		case attrIPAddrIPv4, attrIPAddrIPv6:
			var ok bool
			if a, ok = netip.AddrFromSlice(d.Bytes()); !ok {
				return netip.Addr{}, fmt.Errorf("bad address of %d bytes", len(d.Bytes()))
			}
		}
	}
	return a, d.Err()
}

// payload strips the nfgenmsg header from a reply.
func payload(data []byte) ([]byte, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("short ipset reply (%d bytes)", len(data))
	}
	return data[4:], nil
}
