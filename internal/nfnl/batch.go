//go:build linux

package nfnl

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables/expr"
)

// Batch collects nf_tables messages for one transaction. Its builder
// methods never fail: a mistake (an expression that does not marshal, an
// attribute too long) is kept and returned by Err and by Conn.Commit,
// which then sends nothing. The zero value is an empty batch.
//
// Messages are applied in the order they were added, and all or none of
// them take effect. Every message carries no ECHO and no ACK flag: the
// kernel answers only for messages that fail.
type Batch struct {
	enc   encoder
	ops   []op
	genID uint32
	check bool
	// echoed holds, after a commit, the rules the kernel echoed for the
	// messages marked with Echo, by message index.
	echoed map[int]Rule
	// owners says whose each part of the batch is (SetOwner), from a
	// byte offset on, in order.
	owners []ownerSpan
	// elems is the last message when it is a list of elements, which
	// the next elements of its set go on filling.
	elems elemsMessage
}

// ownerSpan makes the batch's bytes from off on belong to owner.
type ownerSpan struct {
	off   int
	owner any
}

// elemsMessage locates a message of elements being filled.
type elemsMessage struct {
	msg  int // its index in ops, plus one; 0 for none
	list int // the offset of its element list
	n    int // its elements
}

// op describes one message of a batch, for error reports and String.
type op struct {
	off    int
	verb   string
	kind   string
	family Family
	table  string
	name   string
	detail string
}

func (o op) String() string {
	var b strings.Builder
	b.WriteString(o.verb)
	b.WriteByte(' ')
	b.WriteString(o.kind)
	b.WriteByte(' ')
	b.WriteString(o.family.String())
	if o.table != "" {
		b.WriteByte(' ')
		b.WriteString(o.table)
	}
	if o.name != "" {
		b.WriteByte(' ')
		b.WriteString(o.name)
	}
	if o.detail != "" {
		b.WriteString(" (")
		b.WriteString(o.detail)
		b.WriteByte(')')
	}
	return b.String()
}

// Len returns the number of messages in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Size returns the number of bytes the batch's messages take.
func (b *Batch) Size() int { return max(len(b.enc.b)-batchReserve, 0) }

// batchReserve is room kept at the start of a batch's buffer for the
// BATCH_BEGIN message (header, nfgenmsg and a generation attribute), so that
// a commit sends the buffer without copying it.
const batchReserve = nlmsgHdrLen + nfgenLen + nlaHdrLen + 4

// Grow makes room for n more bytes of messages, so that a caller that
// knows roughly how big a batch will be saves the copies of growing it.
func (b *Batch) Grow(n int) {
	if len(b.enc.b) == 0 {
		b.enc.b = make([]byte, batchReserve, batchReserve+n)
		return
	}
	b.enc.b = slices.Grow(b.enc.b, n)
}

// GrowMessages makes room for n more messages in the batch's record of
// them: a large batch built without it copies that record many times
// over as it grows.
func (b *Batch) GrowMessages(n int) { b.ops = slices.Grow(b.ops, n) }

// Err returns the first mistake made while building the batch.
func (b *Batch) Err() error { return b.enc.err }

// String lists the batch's messages, one a line.
func (b *Batch) String() string {
	var s strings.Builder
	for _, o := range b.ops {
		s.WriteString(o.String())
		s.WriteByte('\n')
	}
	return s.String()
}

// Describe returns the description of message i (0-based), as used in
// error reports, such as "add rule inet kproxy services".
func (b *Batch) Describe(i int) string {
	if i < 0 || i >= len(b.ops) {
		return fmt.Sprintf("message %d", i)
	}
	return b.ops[i].String()
}

// SetOwner makes what the batch holds from now on belong to owner, until
// the next SetOwner: the messages added, and the elements, which a
// message of one set's elements may hold for several owners. nil belongs
// to no one, as does everything added before the first SetOwner. An
// owner is a comparable value that means something to the caller, such
// as the service port a message is written for: a message the kernel
// refuses reports its owner (MessageError.Owner), and for a message of
// elements, the owner of the element the kernel points at.
func (b *Batch) SetOwner(owner any) {
	end := max(len(b.enc.b), batchReserve)
	n := len(b.owners)
	switch {
	case n == 0 && owner == nil:
		return
	case n > 0 && b.owners[n-1].owner == owner:
		return
	case n > 0 && b.owners[n-1].off == end:
		b.owners = b.owners[:n-1]
		if n > 1 && b.owners[n-2].owner == owner {
			return
		}
	}
	b.owners = append(b.owners, ownerSpan{off: end, owner: owner})
}

// Owner returns whose message i (0-based) is (SetOwner): nil when it is
// no one's, or holds several owners' elements.
func (b *Batch) Owner(i int) any {
	if i < 0 || i >= len(b.ops) {
		return nil
	}
	return b.ownerOf(i, 0)
}

// ownerAt returns the owner of the byte at off.
func (b *Batch) ownerAt(off int) any {
	i, found := slices.BinarySearchFunc(b.owners, off, func(s ownerSpan, off int) int { return cmp.Compare(s.off, off) })
	if !found {
		i--
	}
	if i < 0 {
		return nil
	}
	return b.owners[i].owner
}

// soleOwner returns the owner of every byte in [from, to), or nil when
// they have several.
func (b *Batch) soleOwner(from, to int) any {
	o := b.ownerAt(from)
	i, _ := slices.BinarySearchFunc(b.owners, from+1, func(s ownerSpan, off int) int { return cmp.Compare(s.off, off) })
	for ; i < len(b.owners) && b.owners[i].off < to; i++ {
		if b.owners[i].owner != o {
			return nil
		}
	}
	return o
}

// msgEnd returns the offset of the end of message i.
func (b *Batch) msgEnd(i int) int {
	if i+1 < len(b.ops) {
		return b.ops[i+1].off
	}
	return len(b.enc.b)
}

// contentStart returns the offset where the owned content of message i
// begins: its first element, for a message of elements (the table and
// set it names are every element's), else the message itself.
func (b *Batch) contentStart(i int) int {
	if b.ops[i].kind != "elements" {
		return b.ops[i].off
	}
	if at := b.attrData(i, attrElemListElems); at >= 0 {
		return at
	}
	return b.ops[i].off
}

// ownerOf returns the owner of message i, or of the part of it at attr
// (an offset from its start that the kernel pointed at; 0 for none): the
// element there, for a message of elements. nil when the part has no
// owner, or the message several.
func (b *Batch) ownerOf(i, attr int) any {
	from, to := b.contentStart(i), b.msgEnd(i)
	if at := b.ops[i].off + attr; attr > 0 && at >= from && at < to {
		return b.ownerAt(at)
	}
	return b.soleOwner(from, to)
}

// RequireGeneration makes the batch apply only if the ruleset generation is
// still id; otherwise Commit fails with ErrGenerationChanged and nothing
// changes. It lets a caller that read the kernel's state commit changes
// computed from it without losing someone else's commit in between.
func (b *Batch) RequireGeneration(id uint32) {
	b.genID, b.check = id, true
}

func (b *Batch) begin(typ uint16, flags uint16, fam Family, o op) int {
	if len(b.enc.b) == 0 {
		b.enc.b = make([]byte, batchReserve, 4096)
	}
	o.off = len(b.enc.b)
	b.ops = append(b.ops, o)
	return b.enc.message(subsysNFTables<<8|typ, nlmRequest|flags, fam, 0)
}

// AddTable creates table t, or does nothing if it exists.
func (b *Batch) AddTable(t Table) {
	m := b.begin(msgNewTable, nlmCreate, t.Family, op{verb: "add", kind: "table", family: t.Family, table: t.Name})
	b.enc.str(attrTableName, t.Name)
	b.enc.u32(attrTableFlags, t.Flags)
	if len(t.UserData) > 0 {
		b.enc.attr(attrTableUData, t.UserData)
	}
	b.enc.endMessage(m)
}

// DelTable deletes a table and everything in it; the commit fails with
// ENOENT if it does not exist.
func (b *Batch) DelTable(fam Family, name string) {
	m := b.begin(msgDelTable, 0, fam, op{verb: "delete", kind: "table", family: fam, table: name})
	b.enc.str(attrTableName, name)
	b.enc.endMessage(m)
}

// FlushTable deletes every rule of every chain of a table, leaving its
// chains, sets and elements.
func (b *Batch) FlushTable(fam Family, name string) {
	m := b.begin(msgDelRule, 0, fam, op{verb: "flush", kind: "table", family: fam, table: name})
	b.enc.str(attrRuleTable, name)
	b.enc.endMessage(m)
}

// AddChain creates chain c, or does nothing if it exists with the same hook.
func (b *Batch) AddChain(c Chain) {
	m := b.begin(msgNewChain, nlmCreate, c.Family, op{verb: "add", kind: "chain", family: c.Family, table: c.Table, name: c.Name})
	b.enc.str(attrChainTable, c.Table)
	b.enc.str(attrChainName, c.Name)
	if h := c.Hook; h != nil {
		n := b.enc.nest(attrChainHook)
		b.enc.u32(attrHookNum, h.Num)
		b.enc.u32(attrHookPriority, uint32(h.Priority))
		if h.Device != "" {
			b.enc.str(attrHookDev, h.Device)
		}
		b.enc.endNest(n)
		if h.Policy != nil {
			b.enc.u32(attrChainPolicy, uint32(*h.Policy))
		}
		b.enc.str(attrChainType, h.Type)
	}
	if len(c.UserData) > 0 {
		b.enc.attr(attrChainUData, c.UserData)
	}
	b.enc.endMessage(m)
}

// DelChain deletes an empty, unreferenced chain.
func (b *Batch) DelChain(fam Family, table, name string) {
	m := b.begin(msgDelChain, 0, fam, op{verb: "delete", kind: "chain", family: fam, table: table, name: name})
	b.enc.str(attrChainTable, table)
	b.enc.str(attrChainName, name)
	b.enc.endMessage(m)
}

// FlushChain deletes every rule of a chain.
func (b *Batch) FlushChain(fam Family, table, name string) {
	m := b.begin(msgDelRule, 0, fam, op{verb: "flush", kind: "chain", family: fam, table: table, name: name})
	b.enc.str(attrRuleTable, table)
	b.enc.str(attrRuleChain, name)
	b.enc.endMessage(m)
}

// AddRule appends r to its chain, or adds it after the rule whose handle is
// r.Position.
func (b *Batch) AddRule(r Rule) { b.rule(r, nlmCreate|nlmAppend, "add") }

// InsertRule prepends r to its chain, or inserts it before the rule whose
// handle is r.Position.
func (b *Batch) InsertRule(r Rule) { b.rule(r, nlmCreate, "insert") }

// ReplaceRule replaces the rule whose handle is r.Handle with r.
func (b *Batch) ReplaceRule(r Rule) { b.rule(r, nlmReplace, "replace") }

func (b *Batch) rule(r Rule, flags uint16, verb string) {
	o := op{verb: verb, kind: "rule", family: r.Family, table: r.Table, name: r.Chain}
	if r.Handle != 0 {
		o.detail = fmt.Sprintf("handle %d", r.Handle)
	}
	m := b.begin(msgNewRule, flags, r.Family, o)
	b.enc.str(attrRuleTable, r.Table)
	b.enc.str(attrRuleChain, r.Chain)
	if r.Handle != 0 {
		b.enc.u64(attrRuleHandle, r.Handle)
	}
	if r.Position != 0 {
		b.enc.u64(attrRulePosition, r.Position)
	}
	if r.PositionID != 0 {
		b.enc.u32(attrRulePosID, r.PositionID)
	}
	if r.ID != 0 {
		b.enc.u32(attrRuleID, r.ID)
	}
	n := b.enc.nest(attrRuleExprs)
	if len(r.Exprs) == 0 {
		for _, x := range r.Raw {
			en := b.enc.nest(attrListElem)
			b.enc.str(attrExprName, x.Name)
			b.enc.attr(attrExprData|nlaNested, x.Data)
			b.enc.endNest(en)
		}
	}
	for i, e := range r.Exprs {
		data, err := expr.Marshal(byte(r.Family), e)
		if err != nil {
			b.enc.fail(fmt.Errorf("%s: expression %d (%T): %w", o, i, e, err))
			continue
		}
		en := b.enc.nest(attrListElem)
		b.enc.b = append(b.enc.b, data...)
		b.enc.endNest(en)
	}
	b.enc.endNest(n)
	if c := r.Compat; c != nil {
		cn := b.enc.nest(attrRuleCompat)
		b.enc.u32(attrCompatProto, c.Proto)
		b.enc.u32(attrCompatFlags, c.Flags)
		b.enc.endNest(cn)
	}
	if len(r.UserData) > 0 {
		b.enc.attr(attrRuleUData, r.UserData)
	}
	b.enc.endMessage(m)
}

// Echo asks the kernel to send message i (0-based; a rule addition) back
// once the batch is committed, as NLM_F_ECHO does: with its handle. After
// a successful Commit, Echoed returns it. Echo ignores other messages.
func (b *Batch) Echo(i int) {
	if i < 0 || i >= len(b.ops) || b.ops[i].kind != "rule" || b.ops[i].verb == "delete" {
		return
	}
	off := b.ops[i].off + 6
	flags := uint16(b.enc.b[off]) | uint16(b.enc.b[off+1])<<8
	flags |= nlmEcho
	b.enc.b[off], b.enc.b[off+1] = byte(flags), byte(flags>>8)
}

// Echoed returns the rule the kernel echoed for message i, which Echo
// marked, after a successful Commit: the rule as added, with its handle.
func (b *Batch) Echoed(i int) (Rule, bool) {
	r, ok := b.echoed[i]
	return r, ok
}

// DelRule deletes the rule with the given handle.
func (b *Batch) DelRule(fam Family, table, chain string, handle uint64) {
	m := b.begin(msgDelRule, 0, fam, op{verb: "delete", kind: "rule", family: fam, table: table, name: chain, detail: fmt.Sprintf("handle %d", handle)})
	b.enc.str(attrRuleTable, table)
	b.enc.str(attrRuleChain, chain)
	b.enc.u64(attrRuleHandle, handle)
	b.enc.endMessage(m)
}

// AddSet creates set s, or does nothing if a set of that name exists with
// the same definition (the commit fails with EEXIST if it differs).
func (b *Batch) AddSet(s Set) {
	m := b.begin(msgNewSet, nlmCreate, s.Family, op{verb: "add", kind: "set", family: s.Family, table: s.Table, name: s.Name})
	b.enc.str(attrSetTable, s.Table)
	b.enc.str(attrSetName, s.Name)
	b.enc.u32(attrSetFlags, s.Flags)
	b.enc.u32(attrSetKeyType, s.KeyType)
	b.enc.u32(attrSetKeyLen, s.KeyLen)
	if s.Flags&SetMap != 0 {
		b.enc.u32(attrSetDataType, s.DataType)
		if s.DataType != TypeVerdict {
			b.enc.u32(attrSetDataLen, s.DataLen)
		}
	}
	if s.Size != 0 || len(s.Fields) > 0 {
		n := b.enc.nest(attrSetDesc)
		if s.Size != 0 {
			b.enc.u32(attrDescSize, s.Size)
		}
		if len(s.Fields) > 0 {
			cn := b.enc.nest(attrDescConcat)
			for _, l := range s.Fields {
				fn := b.enc.nest(attrListElem)
				b.enc.u32(attrFieldLen, l)
				b.enc.endNest(fn)
			}
			b.enc.endNest(cn)
		}
		b.enc.endNest(n)
	}
	b.enc.u32(attrSetID, s.ID)
	if s.Timeout != 0 {
		b.enc.u64(attrSetTimeout, uint64(s.Timeout/time.Millisecond))
	}
	if len(s.UserData) > 0 {
		b.enc.attr(attrSetUData, s.UserData)
	}
	b.enc.endMessage(m)
}

// DelSet deletes a set that no rule refers to.
func (b *Batch) DelSet(fam Family, table, name string) {
	m := b.begin(msgDelSet, 0, fam, op{verb: "delete", kind: "set", family: fam, table: table, name: name})
	b.enc.str(attrSetTable, table)
	b.enc.str(attrSetName, name)
	b.enc.endMessage(m)
}

// FlushSet deletes every element of a set.
func (b *Batch) FlushSet(fam Family, table, name string) {
	m := b.begin(msgDelSetElem, 0, fam, op{verb: "flush", kind: "set", family: fam, table: table, name: name})
	b.enc.str(attrElemListTable, table)
	b.enc.str(attrElemListSet, name)
	b.enc.endMessage(m)
}

// elemChunk bounds the bytes of elements in one message: the element list
// is one attribute, whose length must fit 16 bits.
const elemChunk = 60 << 10

// AddElements adds elements to a set. An element that exists with the same
// data is left alone; one with other data fails the commit with EBUSY.
func (b *Batch) AddElements(fam Family, table, set string, elems []Element) {
	b.elements(msgNewSetElem, nlmCreate, "add", fam, table, set, elems)
}

// DelElements deletes elements (by key) from a set.
func (b *Batch) DelElements(fam Family, table, set string, elems []Element) {
	b.elements(msgDelSetElem, 0, "delete", fam, table, set, elems)
}

// elements adds elems in messages of at most about elemChunk bytes of
// elements each, going on filling the batch's last message when it is
// one of the same verb and set: elements added in several calls (for
// several owners, say) share messages as those of one call do.
func (b *Batch) elements(typ, flags uint16, verb string, fam Family, table, set string, elems []Element) {
	for len(elems) > 0 {
		e := b.elems
		if !b.fills(verb, fam, table, set) {
			o := op{verb: verb, kind: "elements", family: fam, table: table, name: set}
			b.begin(typ, flags, fam, o)
			b.enc.str(attrElemListTable, table)
			b.enc.str(attrElemListSet, set)
			e = elemsMessage{msg: len(b.ops), list: b.enc.nest(attrElemListElems)}
		}
		start, i := e.list+nlaHdrLen, 0
		for i < len(elems) && (e.n+i == 0 || len(b.enc.b)-start < elemChunk) {
			b.element(&elems[i])
			i++
		}
		e.n += i
		b.enc.endNest(e.list)
		b.enc.endMessage(b.ops[e.msg-1].off)
		b.ops[e.msg-1].detail = describeElems(e.n)
		b.elems = e
		elems = elems[i:]
	}
}

// fills reports whether the batch's last message is one of elements of
// the same verb and set, with room for more.
func (b *Batch) fills(verb string, fam Family, table, set string) bool {
	e := b.elems
	if e.msg == 0 || e.msg != len(b.ops) {
		return false
	}
	o := &b.ops[e.msg-1]
	return o.verb == verb && o.family == fam && o.table == table && o.name == set &&
		len(b.enc.b)-(e.list+nlaHdrLen) < elemChunk
}

func describeElems(n int) string {
	if n == 1 {
		return "1 element"
	}
	return fmt.Sprintf("%d elements", n)
}

func (b *Batch) element(el *Element) {
	n := b.enc.nest(attrListElem)
	if el.Flags != 0 {
		b.enc.u32(attrElemFlags, el.Flags)
	}
	if el.Key != nil {
		b.enc.data(attrElemKey, el.Key)
	}
	if el.KeyEnd != nil {
		b.enc.data(attrElemKeyEnd, el.KeyEnd)
	}
	switch {
	case el.Verdict != nil:
		b.enc.verdict(attrElemData, *el.Verdict)
	case el.Data != nil:
		b.enc.data(attrElemData, el.Data)
	}
	if el.Timeout != 0 {
		b.enc.u64(attrElemTimeout, uint64(el.Timeout/time.Millisecond))
	}
	if len(el.UserData) > 0 {
		b.enc.attr(attrElemUData, el.UserData)
	}
	b.enc.endNest(n)
}
