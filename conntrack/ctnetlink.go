package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/internal/nl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// ctnetlink message types and attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctMsgGet    = nfnlSubsysCtnetlink<<8 | 1
	ctMsgDelete = nfnlSubsysCtnetlink<<8 | 2

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaTimeout    = 7
	ctaMark       = 8
	ctaID         = 12
	ctaZone       = 18

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3
)

// errInterrupted marks a dump the kernel flagged NLM_F_DUMP_INTR: complete
// messages, but the table changed while they were read.
var errInterrupted = errors.New("dump interrupted")

// entry is a dumped flow with what deleting exactly it takes.
type entry struct {
	flow Flow
	// orig is the payload of CTA_TUPLE_ORIG as the kernel sent it.
	orig []byte
	// id is CTA_ID: the kernel refuses to delete a different flow that
	// reuses the tuple.
	id    uint32
	hasID bool
	// hasZone says whether the kernel sent CTA_ZONE.
	hasZone bool
}

// ctTable is the conntrack table behind one ctnetlink socket. Unlike the
// ctnetlink parsers of the common Go netlink libraries it reads the ports
// of every protocol that has them (SCTP and DCCP as well as TCP and UDP).
type ctTable struct {
	c   *nl.Conn
	req nl.Batch // the request under way, its memory reused
}

func nfgenmsg(fam uint8) []byte { return []byte{fam, nfnetlinkV0, 0, 0} }

func (t *ctTable) dump(ctx context.Context, fam uint8) ([]entry, error) {
	t.req.Reset()
	t.req.Message(ctMsgGet, 0, nfgenmsg(fam)...)
	var out []entry
	err := t.c.Dump(ctx, &t.req, func(_ uint16, data []byte) error {
		if len(data) < 4 {
			return fmt.Errorf("short ctnetlink message (%d bytes)", len(data))
		}
		e, err := parseEntry(data[0], data[4:])
		if err != nil {
			return err
		}
		// The message is read into the socket's buffer, which the next
		// read reuses.
		e.orig = slices.Clone(e.orig)
		out = append(out, e)
		return nil
	})
	if errors.Is(err, nl.ErrDumpInterrupted) {
		return out, errInterrupted
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (t *ctTable) remove(ctx context.Context, fam uint8, e entry) error {
	t.req.Reset()
	t.req.Message(ctMsgDelete, 0, nfgenmsg(fam)...)
	t.req.Attr(ctaTupleOrig|nl.Nested, e.orig)
	if e.hasZone {
		t.req.BigEndian16(ctaZone, e.flow.Zone)
	}
	if e.hasID {
		t.req.BigEndian32(ctaID, e.id)
	}
	return t.c.Get(ctx, &t.req, nil)
}

func (t *ctTable) close() error { return t.c.Close() }

// parseEntry parses the attributes of one flow of family fam.
func parseEntry(fam uint8, b []byte) (entry, error) {
	e := entry{flow: Flow{Family: servicelb.IPv4}}
	if fam == afInet6 {
		e.flow.Family = servicelb.IPv6
	}
	ad := nl.NewDecoder(b)
	ad.Order = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			e.orig = ad.Bytes()
			ad.Nested(func(nd *nl.Decoder) error {
				e.flow.Orig, e.flow.Protocol = parseTuple(nd)
				return nil
			})
		case ctaTupleReply:
			ad.Nested(func(nd *nl.Decoder) error {
				e.flow.Reply, _ = parseTuple(nd)
				return nil
			})
		case ctaTimeout:
			e.flow.Timeout = time.Duration(ad.Uint32()) * time.Second
		case ctaMark:
			e.flow.Mark = ad.Uint32()
		case ctaZone:
			e.flow.Zone, e.hasZone = ad.Uint16(), true
		case ctaID:
			e.id, e.hasID = ad.Uint32(), true
		}
	}
	if err := ad.Err(); err != nil {
		return e, fmt.Errorf("parse flow: %w", err)
	}
	if e.orig == nil {
		return e, errors.New("parse flow: no original tuple")
	}
	return e, nil
}

// parseTuple parses a CTA_TUPLE_* nest: addresses, protocol and ports.
func parseTuple(ad *nl.Decoder) (Tuple, uint8) {
	var src, dst netip.Addr
	var sport, dport uint16
	var proto uint8
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleIP:
			ad.Nested(func(nd *nl.Decoder) error {
				for nd.Next() {
					a, _ := netip.AddrFromSlice(nd.Bytes())
					switch nd.Type() {
					case ctaIPv4Src, ctaIPv6Src:
						src = a.Unmap()
					case ctaIPv4Dst, ctaIPv6Dst:
						dst = a.Unmap()
					}
				}
				return nil
			})
		case ctaTupleProto:
			ad.Nested(func(nd *nl.Decoder) error {
				for nd.Next() {
					switch nd.Type() {
					case ctaProtoNum:
						proto = nd.Uint8()
					case ctaProtoSrcPort:
						sport = nd.Uint16()
					case ctaProtoDstPort:
						dport = nd.Uint16()
					}
				}
				return nil
			})
		}
	}
	return Tuple{Src: netip.AddrPortFrom(src, sport), Dst: netip.AddrPortFrom(dst, dport)}, proto
}
