package xtables

import (
	"encoding/binary"
)

// Netlink and nf_tables message constants (linux/netlink.h,
// linux/netfilter/nfnetlink.h, linux/netfilter/nf_tables.h).
const (
	nlmRequest = 0x1
	nlmEcho    = 0x8
	nlmReplace = 0x100
	nlmExcl    = 0x200
	nlmCreate  = 0x400
	nlmAppend  = 0x800

	subsysNFTables = 10

	msgNewTable = 0
	msgGetTable = 1
	msgNewChain = 3
	msgGetChain = 4
	msgDelChain = 5
	msgNewRule  = 6
	msgGetRule  = 7
	msgDelRule  = 8
	msgNewGen   = 15
	msgGetGen   = 16

	attrTableName = 1
	attrTableUse  = 3

	attrChainTable  = 1
	attrChainHandle = 2
	attrChainName   = 3
	attrChainHook   = 4
	attrChainPolicy = 5
	attrChainUse    = 6
	attrChainType   = 7
	attrHookNum     = 1
	attrHookPrio    = 2

	attrRuleTable      = 1
	attrRuleChain      = 2
	attrRuleHandle     = 3
	attrRuleExprs      = 4
	attrRuleCompat     = 5
	attrRulePosition   = 6
	attrRuleID         = 9
	attrRulePositionID = 10
	attrCompatProto    = 1
	attrCompatFlags    = 2

	compatInvert = 1 << 1 // NFT_RULE_COMPAT_F_INV

	attrGenID = 1
)

// msgWriter appends nf_tables netlink messages, each with its nlmsghdr
// and nfgenmsg, to one buffer: the body of a batch.
type msgWriter struct {
	exprWriter
	seq   uint32
	count int
}

// begin starts a message and returns its offset for finish.
func (m *msgWriter) begin(typ uint16, flags uint16, f Family) int {
	off := len(m.b)
	m.seq++
	m.count++
	m.b = binary.LittleEndian.AppendUint32(m.b, 0)
	m.b = binary.LittleEndian.AppendUint16(m.b, subsysNFTables<<8|typ)
	m.b = binary.LittleEndian.AppendUint16(m.b, nlmRequest|flags)
	m.b = binary.LittleEndian.AppendUint32(m.b, m.seq)
	m.b = binary.LittleEndian.AppendUint32(m.b, 0)
	m.b = append(m.b, byte(f), 0, 0, 0)
	return off
}

func (m *msgWriter) finish(off int) {
	binary.LittleEndian.PutUint32(m.b[off:], uint32(len(m.b)-off))
}

// newTable creates table t if it does not exist.
func (m *msgWriter) newTable(t Table) {
	off := m.begin(msgNewTable, nlmCreate, t.Family)
	m.str(attrTableName, string(t.Name))
	m.finish(off)
}

// newBaseChain creates a builtin chain as iptables-nft does, policy accept.
func (m *msgWriter) newBaseChain(t Table, bc BaseChain) {
	off := m.begin(msgNewChain, nlmCreate, t.Family)
	m.str(attrChainTable, string(t.Name))
	m.str(attrChainName, bc.Name)
	h := m.exprWriter.begin(attrChainHook)
	m.u32(attrHookNum, bc.Hook)
	m.u32(attrHookPrio, uint32(bc.Priority))
	m.end(h)
	m.u32(attrChainPolicy, verdictAccept)
	m.str(attrChainType, bc.Type)
	m.finish(off)
}

// newChain creates a user chain.
func (m *msgWriter) newChain(t Table, name string) {
	off := m.begin(msgNewChain, nlmCreate, t.Family)
	m.str(attrChainTable, string(t.Name))
	m.str(attrChainName, name)
	m.finish(off)
}

// delChain deletes an empty user chain.
func (m *msgWriter) delChain(t Table, name string) {
	off := m.begin(msgDelChain, 0, t.Family)
	m.str(attrChainTable, string(t.Name))
	m.str(attrChainName, name)
	m.finish(off)
}

// flushChain deletes every rule of a chain.
func (m *msgWriter) flushChain(t Table, name string) {
	off := m.begin(msgDelRule, 0, t.Family)
	m.str(attrRuleTable, string(t.Name))
	m.str(attrRuleChain, name)
	m.finish(off)
}

// delRule deletes one rule by handle.
func (m *msgWriter) delRule(t Table, chain string, handle uint64) {
	off := m.begin(msgDelRule, 0, t.Family)
	m.str(attrRuleTable, string(t.Name))
	m.str(attrRuleChain, chain)
	m.u64(attrRuleHandle, handle)
	m.finish(off)
}

// Position says where a new rule goes in its chain.
type position struct {
	kind   posKind
	handle uint64 // for posBeforeHandle
	id     uint32 // for posBeforeID
}

type posKind uint8

const (
	posAppend posKind = iota
	posHead
	posBeforeHandle
	posBeforeID
)

// addRule adds r to chain at pos. A non-zero id names the rule within the
// batch, so that later rules of the same batch can be placed before it.
// With echo, the kernel sends the rule back after the commit, with its
// handle.
func (m *msgWriter) addRule(t Table, chain string, r *Rule, pos position, id uint32, echo bool) error {
	start := len(m.b)
	flags := uint16(nlmCreate)
	if pos.kind == posAppend {
		flags |= nlmAppend
	}
	if echo {
		flags |= nlmEcho
	}
	off := m.begin(msgNewRule, flags, t.Family)
	m.str(attrRuleTable, string(t.Name))
	m.str(attrRuleChain, chain)
	switch pos.kind {
	case posBeforeHandle:
		m.u64(attrRulePosition, pos.handle)
	case posBeforeID:
		m.u32(attrRulePositionID, pos.id)
	}
	if id != 0 {
		m.u32(attrRuleID, id)
	}
	e := m.exprWriter.begin(attrRuleExprs)
	if err := encodeRule(&m.exprWriter, t.Family, r); err != nil {
		m.b = m.b[:start]
		m.seq--
		m.count--
		return err
	}
	m.end(e)
	c := m.exprWriter.begin(attrRuleCompat)
	m.u32(attrCompatProto, uint32(r.Proto))
	var cf uint32
	if r.NotProto {
		cf = compatInvert
	}
	m.u32(attrCompatFlags, cf)
	m.end(c)
	m.finish(off)
	return nil
}

// EncodeExprs returns the NFTA_RULE_EXPRESSIONS payload of r in a table of
// family f: the nf_tables expressions iptables-nft writes for the rule.
func EncodeExprs(f Family, r *Rule) ([]byte, error) {
	var w exprWriter
	if err := encodeRule(&w, f, r); err != nil {
		return nil, err
	}
	return w.b, nil
}
