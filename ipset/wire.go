package ipset

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
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

	nlaNetByteOrder = 0x4000 // NLA_F_NET_BYTEORDER
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

// message builds an ipset netlink request: the nfgenmsg header followed by
// the attributes that enc fills.
func message(cmd uint8, flags netlink.HeaderFlags, fill func(ae *netlink.AttributeEncoder)) (netlink.Message, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	fill(ae)
	attrs, err := ae.Encode()
	if err != nil {
		return netlink.Message{}, err
	}
	// nfgenmsg: family NFPROTO_UNSPEC, version NFNETLINK_V0, res_id 0.
	data := append([]byte{0, 0, 0, 0}, attrs...)
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysIPSet<<8 | uint16(cmd)), Flags: netlink.Request | flags},
		Data:   data,
	}, nil
}

func putU32(ae *netlink.AttributeEncoder, typ uint16, v uint32) { ae.Uint32(typ|nlaNetByteOrder, v) }
func putU16(ae *netlink.AttributeEncoder, typ uint16, v uint16) { ae.Uint16(typ|nlaNetByteOrder, v) }

func putName(ae *netlink.AttributeEncoder, typ uint16, s string) { ae.String(typ, s) }

// The entries of an add or delete are many (a hundred thousand endpoints'
// loop-back entries at a cold sync): they are appended to the message's
// bytes directly, with no allocation per entry, in the encoding of
// github.com/mdlayher/netlink's AttributeEncoder with big-endian values.

// appendAttr appends an attribute header for n bytes of data.
func appendAttr(b []byte, typ uint16, n int) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+n))
	return binary.NativeEndian.AppendUint16(b, typ)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendU8(b []byte, typ uint16, v uint8) []byte {
	return pad4(append(appendAttr(b, typ, 1), v))
}

func appendU16(b []byte, typ, v uint16) []byte {
	return pad4(binary.BigEndian.AppendUint16(appendAttr(b, typ|nlaNetByteOrder, 2), v))
}

func appendU32(b []byte, typ uint16, v uint32) []byte {
	return binary.BigEndian.AppendUint32(appendAttr(b, typ|nlaNetByteOrder, 4), v)
}

func appendString(b []byte, typ uint16, s string) []byte {
	return pad4(append(append(appendAttr(b, typ, len(s)+1), s...), 0))
}

// appendNest opens a nested attribute; endNest closes it, given where it
// started.
func appendNest(b []byte, typ uint16) ([]byte, int) {
	return appendAttr(b, typ|netlink.Nested, 0), len(b)
}

func endNest(b []byte, at int) []byte {
	binary.NativeEndian.PutUint16(b[at:], uint16(len(b)-at))
	return b
}

// appendIPAddr appends the attribute inside an IPADDR nest.
func appendIPAddr(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return append(appendAttr(b, attrIPAddrIPv4|nlaNetByteOrder, 4), v[:]...)
	}
	v := a.As16()
	return append(appendAttr(b, attrIPAddrIPv6|nlaNetByteOrder, 16), v[:]...)
}

// appendAddr appends an address as ipset's nested IPADDR attribute.
func appendAddr(b []byte, typ uint16, a netip.Addr) []byte {
	b, at := appendNest(b, typ)
	return endNest(appendIPAddr(b, a), at)
}

// readAddr decodes a nested IPADDR attribute.
func readAddr(b []byte) (netip.Addr, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return netip.Addr{}, err
	}
	var a netip.Addr
	for ad.Next() {
		switch ad.Type() {
		case attrIPAddrIPv4, attrIPAddrIPv6:
			var ok bool
			if a, ok = netip.AddrFromSlice(ad.Bytes()); !ok {
				return netip.Addr{}, fmt.Errorf("bad address of %d bytes", len(ad.Bytes()))
			}
		}
	}
	return a, ad.Err()
}

// payload strips the nfgenmsg header from a reply.
func payload(m netlink.Message) ([]byte, error) {
	if len(m.Data) < 4 {
		return nil, fmt.Errorf("short ipset reply (%d bytes)", len(m.Data))
	}
	return m.Data[4:], nil
}
