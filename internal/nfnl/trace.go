//go:build linux

package nfnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// Trace event values (NFT_MSG_TRACE, NFTA_TRACE_*, NFT_TRACETYPE_*).
const (
	msgTrace          = 17
	groupTrace        = 9 // NFNLGRP_NFTRACE
	attrTraceTable    = 1
	attrTraceChain    = 2
	attrTraceHandle   = 3
	attrTraceType     = 4
	attrTraceVerdict  = 5
	attrTraceID       = 6
	attrTraceIIF      = 10
	attrTraceOIF      = 12
	attrTraceMark     = 14
	attrTraceNFProto  = 15
	attrTracePolicy   = 16
	nfprotoIPv4       = 2
	nfprotoIPv6       = 10
	traceChainPrio    = -150   // after conntrack (-200), before NAT (-100) and filtering (0)
	ctStateNew        = 1 << 3 // NF_CT_STATE_BIT(IP_CT_NEW)
	defaultTraceQuiet = 250 * time.Millisecond
)

// The kinds of trace event.
const (
	// TraceRule: a rule matched, with its verdict (continue for a rule
	// that only changed the packet, such as setting a mark).
	TraceRule uint32 = 3
	// TraceReturn: the packet reached the end of a chain it jumped to,
	// and returns.
	TraceReturn uint32 = 2
	// TracePolicy: the packet reached the end of a base chain, whose
	// policy decides.
	TracePolicy uint32 = 1
)

// TraceEvent is one step of a traced packet through the rules of a
// namespace, as nf_tables reports it.
type TraceEvent struct {
	// ID is the packet's: every event of one packet has the same.
	ID uint32
	// Type is TraceRule, TraceReturn or TracePolicy.
	Type uint32
	// Family is the table's; NFProto the packet's (IPv4 or IPv6).
	Family  Family
	NFProto uint32
	Table   string
	Chain   string
	// Handle is the rule's, for TraceRule.
	Handle uint64
	// Verdict is the rule's verdict (TraceRule), or the chain's policy
	// (TracePolicy).
	Verdict Verdict
	// IIF and OIF are the packet's interfaces by index, 0 when none.
	IIF, OIF uint32
	Mark     uint32
}

// TraceMatch selects the packets to trace: those to Dst (its address,
// and its port when not 0 and Proto is given) of protocol Proto (an IP
// protocol number, 0: any), from Src when valid and specified.
type TraceMatch struct {
	Src   netip.Addr
	Dst   netip.AddrPort
	Proto uint8
}

// Tracer follows packets through the rules of one network namespace: it
// marks the first packet of each new flow a TraceMatch selects for
// tracing (ct state new meta nftrace set 1, in a table of its own, at
// priority -150 of the prerouting and output hooks: after conntrack,
// before NAT and filtering) and reads the kernel's trace events of it.
// Close removes the table.
type Tracer struct {
	s     *nl.Socket
	conn  *Conn
	table string
	// Quiet is how long the events of a packet may pause before Next
	// takes the packet's trace as complete; default 250ms.
	Quiet time.Duration
}

// StartTrace subscribes to the trace events of the namespace o names, and
// then adds the table named table that marks the packets m selects. The
// table must not exist: a Tracer never touches a table it did not make.
func StartTrace(ctx context.Context, o Options, table string, m TraceMatch) (*Tracer, error) {
	if !m.Dst.Addr().IsValid() {
		return nil, errors.New("nfnl: trace: no destination to match")
	}
	s, err := nl.OpenSocket(unix.NETLINK_NETFILTER, nl.Options{NetNS: o.NetNS, Groups: 1 << (groupTrace - 1), ReadBuffer: 1 << 20})
	if err != nil {
		return nil, fmt.Errorf("nfnl: trace: %w", err)
	}
	conn, err := Open(o)
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	t := &Tracer{s: s, conn: conn, table: table, Quiet: defaultTraceQuiet}
	var b Batch
	b.AddTable(Table{Family: Inet, Name: table})
	for _, c := range []struct {
		name string
		hook uint32
	}{{"prerouting", HookPrerouting}, {"output", HookOutput}} {
		b.AddChain(Chain{Family: Inet, Table: table, Name: c.name, Hook: &Hook{Num: c.hook, Priority: traceChainPrio, Type: "filter"}})
		b.AddRule(Rule{Family: Inet, Table: table, Chain: c.name, Exprs: traceRule(m)})
	}
	if _, err := conn.Commit(ctx, &b); err != nil {
		_ = conn.Close()
		_ = s.Close()
		return nil, fmt.Errorf("nfnl: trace: add table %s: %w", table, err)
	}
	return t, nil
}

// traceRule is the rule that marks the packets m selects.
func traceRule(m TraceMatch) []expr.Any {
	v4 := m.Dst.Addr().Unmap().Is4()
	proto, daddr, saddr, alen := byte(nfprotoIPv4), uint32(16), uint32(12), uint32(4)
	if !v4 {
		proto, daddr, saddr, alen = nfprotoIPv6, 24, 8, 16
	}
	eq := func(data []byte) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, eq([]byte{proto}),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddr, Len: alen}, eq(m.Dst.Addr().Unmap().AsSlice()),
	}
	if m.Src.IsValid() && !m.Src.IsUnspecified() {
		out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: saddr, Len: alen},
			eq(m.Src.Unmap().AsSlice()))
	}
	if m.Proto != 0 {
		out = append(out, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, eq([]byte{m.Proto}))
		if m.Dst.Port() != 0 {
			out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				eq(binary.BigEndian.AppendUint16(nil, m.Dst.Port())))
		}
	}
	// The first packet of a flow alone: the kernel names a packet's
	// trace by its buffer, which the next packet may reuse.
	out = append(out, &expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, ctStateNew), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)})
	return append(out, &expr.Immediate{Register: 1, Data: []byte{1}},
		&expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: 1})
}

// Next returns the trace of the next packet marked: its events in the
// kernel's order, once they have paused for Quiet (a packet's trace has
// no end of its own), or what came before ctx ended. The marking table's
// own events are left out.
func (t *Tracer) Next(ctx context.Context) ([]TraceEvent, error) {
	var out []TraceEvent
	var id uint32
	for {
		rctx := ctx
		cancel := func() {}
		if len(out) > 0 {
			rctx, cancel = context.WithTimeout(ctx, t.Quiet)
		}
		msgs, err := t.s.Read(rctx)
		cancel()
		switch {
		case err != nil && len(out) > 0:
			return out, nil // quiet, or ctx ended: the packet's trace so far
		case err != nil && ctx.Err() != nil:
			return nil, fmt.Errorf("nfnl: trace: no packet: %w", ctx.Err())
		case err != nil:
			return nil, fmt.Errorf("nfnl: trace: %w", err)
		}
		for _, m := range msgs {
			if m.Type != subsysNFTables<<8|msgTrace {
				continue
			}
			ev, err := parseTrace(m.Data)
			if err != nil {
				return out, fmt.Errorf("nfnl: trace: %w", err)
			}
			if ev.Table == t.table {
				continue
			}
			if len(out) == 0 {
				id = ev.ID
			}
			if ev.ID == id {
				out = append(out, ev)
			}
		}
	}
}

// Close removes the marking table and closes the sockets.
func (t *Tracer) Close() error {
	var b Batch
	b.DelTable(Inet, t.table)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := t.conn.Commit(ctx, &b)
	if err != nil {
		err = fmt.Errorf("nfnl: trace: delete table %s: %w", t.table, err)
	}
	return errors.Join(err, t.conn.Close(), t.s.Close())
}

// parseTrace decodes an NFT_MSG_TRACE message.
func parseTrace(d []byte) (TraceEvent, error) {
	fam, as, err := payload(d)
	ev := TraceEvent{Family: fam}
	for _, a := range as {
		switch a.typ {
		case attrTraceTable:
			ev.Table = a.str()
		case attrTraceChain:
			ev.Chain = a.str()
		case attrTraceHandle:
			ev.Handle = a.u64()
		case attrTraceType:
			ev.Type = a.u32()
		case attrTraceID:
			ev.ID = a.u32()
		case attrTraceIIF:
			ev.IIF = a.u32()
		case attrTraceOIF:
			ev.OIF = a.u32()
		case attrTraceMark:
			ev.Mark = a.u32()
		case attrTraceNFProto:
			ev.NFProto = a.u32()
		case attrTracePolicy:
			ev.Verdict = Verdict{Code: int32(a.u32())}
		case attrTraceVerdict:
			vs, verr := attributes(a.data)
			if verr != nil {
				return ev, verr
			}
			for _, v := range vs {
				switch v.typ {
				case attrVerdictCode:
					ev.Verdict.Code = int32(v.u32())
				case attrVerdictChain:
					ev.Verdict.Chain = v.str()
				}
			}
		}
	}
	return ev, err
}

// ChainEnd reports whether the event is the packet running out of a
// chain it jumped to (a return event, or the kernel's event of the end of
// the chain's rules, which names no rule).
func (ev *TraceEvent) ChainEnd() bool {
	return ev.Type == TraceReturn || ev.Type == TraceRule && ev.Handle == 0
}

// VerdictText says what became of the packet at the event: the rule's
// verdict ("goto c", "accept", "continue", ...), "return" at the end of
// a chain, or a base chain's policy ("policy accept").
func (ev *TraceEvent) VerdictText() string {
	switch {
	case ev.ChainEnd():
		return "return"
	case ev.Type == TracePolicy:
		return "policy " + ev.Verdict.String()
	}
	return ev.Verdict.String()
}

// TraceOnce traces the next packet m selects in the namespace o names,
// with a marking table named table (see StartTrace and Tracer.Next), and
// removes the table.
func TraceOnce(ctx context.Context, o Options, table string, m TraceMatch) ([]TraceEvent, error) {
	t, err := StartTrace(ctx, o, table, m)
	if err != nil {
		return nil, err
	}
	evs, err := t.Next(ctx)
	return evs, errors.Join(err, t.Close())
}
