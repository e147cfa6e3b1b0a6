//go:build linux

package nfnl

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables/expr"

	"github.com/kproxy-dev/kproxy/internal/nl"
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
	// enc writes into the chunk under way; chunks are the full ones
	// before it, the first starting with room for BATCH_BEGIN, and starts
	// where each begins in the batch. A large batch grows chunk by chunk,
	// so that it is never copied whole as it grows, and Commit sends the
	// chunks together in one datagram. A message never spans two chunks.
	enc    encoder
	chunks [][]byte
	starts []int
	sealed int // bytes in chunks
	// msgs holds where each message starts in the batch: a batch of a
	// large ruleset has hundreds of thousands of messages, so their
	// descriptions, which only errors and String need, are read back from
	// the messages themselves. The record doubles as it grows (append
	// grows a large slice by a quarter, copying it many times over), and
	// offsets take 32 bits: the kernel takes no datagram of 2 GiB.
	msgs  []uint32
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

// elemsMessage locates a message of elements being filled, in the chunk
// under way, and says what it holds.
type elemsMessage struct {
	msg  int // its index in msgs, plus one; 0 for none
	off  int // its offset in the chunk
	list int // the offset of its element list in the chunk
	n    int // its elements
	typ  uint16
	fam  Family
	// table and set are those the message names.
	table, set string
}

// Chunks of a batch: a chunk is full at chunkSize bytes, or at 1/128th of
// the batch before it when that is more (so that even a batch of 2 GiB,
// beyond which the kernel refuses any, takes far fewer chunks than the
// 1024 buffers a sendmsg takes), and has chunkHeadroom bytes more room, so
// that a message started below the limit fits without moving the chunk
// (a message's expressions or elements take at most 64 KiB). The first
// chunk grows from a few KiB, for small batches, and ends early, at
// firstChunk bytes, unless Grow gave it room.
const (
	chunkSize     = 1 << 20
	chunkHeadroom = 64 << 10
	firstChunk    = 64 << 10
)

func (b *Batch) chunkLimit() int { return max(chunkSize, b.sealed/128) }

// at returns the bytes of the chunk that holds the batch's byte at off,
// from that byte on.
func (b *Batch) at(off int) []byte {
	if off >= b.sealed {
		return b.enc.b[off-b.sealed:]
	}
	i, found := slices.BinarySearch(b.starts, off)
	if !found {
		i--
	}
	return b.chunks[i][off-b.starts[i]:]
}

// seal ends the chunk under way and starts another.
func (b *Batch) seal() {
	b.chunks = append(b.chunks, b.enc.b)
	b.starts = append(b.starts, b.sealed)
	b.sealed += len(b.enc.b)
	b.enc.b = make([]byte, 0, b.chunkLimit()+chunkHeadroom)
}

// Len returns the number of messages in the batch.
func (b *Batch) Len() int { return len(b.msgs) }

// Size returns the number of bytes the batch's messages take.
func (b *Batch) Size() int { return max(b.sealed+len(b.enc.b)-batchReserve, 0) }

// batchReserve is room kept at the start of a batch's buffer for the
// BATCH_BEGIN message (header, nfgenmsg and a generation attribute), so that
// a commit sends the buffer without copying it.
const batchReserve = nl.HeaderLen + nfgenLen + nl.AttrHeaderLen + 4

// Grow makes room for n more bytes of messages, up to the size of a
// chunk, so that a caller that knows roughly how big a batch will be
// saves the copies of growing it.
func (b *Batch) Grow(n int) {
	n = min(n, b.chunkLimit()) + chunkHeadroom
	if len(b.enc.b) == 0 && b.sealed == 0 {
		b.enc.b = make([]byte, batchReserve, batchReserve+n)
		return
	}
	b.enc.b = slices.Grow(b.enc.b, n)
}

// GrowMessages makes room for n more messages in the batch's record of
// them: a large batch built without it copies that record many times
// over as it grows.
func (b *Batch) GrowMessages(n int) { b.msgs = slices.Grow(b.msgs, n) }

// Err returns the first mistake made while building the batch.
func (b *Batch) Err() error { return b.enc.err }

// String lists the batch's messages, one a line.
func (b *Batch) String() string {
	var s strings.Builder
	for i := range b.msgs {
		s.WriteString(b.Describe(i))
		s.WriteByte('\n')
	}
	return s.String()
}

// Describe returns the description of message i (0-based), as used in
// error reports, such as "add rule inet kproxy services".
func (b *Batch) Describe(i int) string {
	if i < 0 || i >= len(b.msgs) {
		return fmt.Sprintf("message %d", i)
	}
	return describe(b.at(int(b.msgs[i])))
}

// end returns the offset of the end of the batch.
func (b *Batch) end() int { return b.sealed + len(b.enc.b) }

// SetOwner makes what the batch holds from now on belong to owner, until
// the next SetOwner: the messages added, and the elements, which a
// message of one set's elements may hold for several owners. nil belongs
// to no one, as does everything added before the first SetOwner. An
// owner is a comparable value that means something to the caller, such
// as the service port a message is written for: a message the kernel
// refuses reports its owner (MessageError.Owner), and for a message of
// elements, the owner of the element the kernel points at.
func (b *Batch) SetOwner(owner any) {
	end := max(b.end(), batchReserve)
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
	if i < 0 || i >= len(b.msgs) {
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
	if i+1 < len(b.msgs) {
		return int(b.msgs[i+1])
	}
	return b.end()
}

// contentStart returns the offset where the owned content of message i
// begins: its first element, for a message of elements (the table and
// set it names are every element's), else the message itself.
func (b *Batch) contentStart(i int) int {
	off := int(b.msgs[i])
	if typ := nl.TypeOf(b.at(off)) & 0xff; typ != msgNewSetElem && typ != msgDelSetElem {
		return off
	}
	if at := b.attrData(i, attrElemListElems); at >= 0 {
		return at
	}
	return off
}

// ownerOf returns the owner of message i, or of the part of it at attr
// (an offset from its start that the kernel pointed at; 0 for none): the
// element there, for a message of elements. nil when the part has no
// owner, or the message several.
func (b *Batch) ownerOf(i, attr int) any {
	from, to := b.contentStart(i), b.msgEnd(i)
	if at := int(b.msgs[i]) + attr; attr > 0 && at >= from && at < to {
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

func (b *Batch) begin(typ uint16, flags uint16, fam Family) int {
	switch {
	case len(b.enc.b) == 0 && b.sealed == 0:
		b.enc.b = make([]byte, batchReserve, 4096)
	case len(b.enc.b) >= b.chunkLimit(),
		len(b.enc.b) >= firstChunk && cap(b.enc.b)-len(b.enc.b) < chunkHeadroom:
		b.seal()
	}
	off := b.end()
	if uint64(off) > math.MaxUint32 {
		b.enc.fail(fmt.Errorf("batch of more than 4 GiB"))
	}
	if len(b.msgs) == cap(b.msgs) {
		b.msgs = slices.Grow(b.msgs, max(len(b.msgs), 64))
	}
	b.msgs = append(b.msgs, uint32(off))
	return b.enc.message(subsysNFTables<<8|typ, nl.Request|flags, fam, 0)
}

// AddTable creates table t, or does nothing if it exists.
func (b *Batch) AddTable(t Table) {
	m := b.begin(msgNewTable, nl.Create, t.Family)
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
	m := b.begin(msgDelTable, 0, fam)
	b.enc.str(attrTableName, name)
	b.enc.endMessage(m)
}

// FlushTable deletes every rule of every chain of a table, leaving its
// chains, sets and elements.
func (b *Batch) FlushTable(fam Family, name string) {
	m := b.begin(msgDelRule, 0, fam)
	b.enc.str(attrRuleTable, name)
	b.enc.endMessage(m)
}

// AddChain creates chain c, or does nothing if it exists with the same hook.
func (b *Batch) AddChain(c Chain) {
	m := b.begin(msgNewChain, nl.Create, c.Family)
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
	m := b.begin(msgDelChain, 0, fam)
	b.enc.str(attrChainTable, table)
	b.enc.str(attrChainName, name)
	b.enc.endMessage(m)
}

// FlushChain deletes every rule of a chain.
func (b *Batch) FlushChain(fam Family, table, name string) {
	m := b.begin(msgDelRule, 0, fam)
	b.enc.str(attrRuleTable, table)
	b.enc.str(attrRuleChain, name)
	b.enc.endMessage(m)
}

// AddRule appends r to its chain, or adds it after the rule whose handle is
// r.Position.
func (b *Batch) AddRule(r Rule) { b.rule(r, nl.Create|nl.Append, "add") }

// InsertRule prepends r to its chain, or inserts it before the rule whose
// handle is r.Position.
func (b *Batch) InsertRule(r Rule) { b.rule(r, nl.Create, "insert") }

// ReplaceRule replaces the rule whose handle is r.Handle with r.
func (b *Batch) ReplaceRule(r Rule) { b.rule(r, nl.Replace, "replace") }

func (b *Batch) rule(r Rule, flags uint16, verb string) {
	m := b.begin(msgNewRule, flags, r.Family)
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
	if len(r.Exprs) == 0 && len(r.Raw) == 0 {
		b.enc.b = append(b.enc.b, r.Encoded...)
	}
	if len(r.Exprs) == 0 {
		for _, x := range r.Raw {
			en := b.enc.nest(attrListElem)
			b.enc.str(attrExprName, x.Name)
			b.enc.attr(attrExprData|nl.Nested, x.Data)
			b.enc.endNest(en)
		}
	}
	for i, e := range r.Exprs {
		data, err := expr.Marshal(byte(r.Family), e)
		if err != nil {
			b.enc.fail(fmt.Errorf("%s rule %s %s %s: expression %d (%T): %w", verb, r.Family, r.Table, r.Chain, i, e, err))
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
	if i < 0 || i >= len(b.msgs) {
		return
	}
	m := b.at(int(b.msgs[i]))
	if nl.TypeOf(m) != subsysNFTables<<8|msgNewRule {
		return
	}
	nl.PutFlags(m, nl.FlagsOf(m)|nl.Echo)
}

// Echoed returns the rule the kernel echoed for message i, which Echo
// marked, after a successful Commit: the rule as added, with its handle.
func (b *Batch) Echoed(i int) (Rule, bool) {
	r, ok := b.echoed[i]
	return r, ok
}

// DelRule deletes the rule with the given handle.
func (b *Batch) DelRule(fam Family, table, chain string, handle uint64) {
	m := b.begin(msgDelRule, 0, fam)
	b.enc.str(attrRuleTable, table)
	b.enc.str(attrRuleChain, chain)
	b.enc.u64(attrRuleHandle, handle)
	b.enc.endMessage(m)
}

// AddSet creates set s, or does nothing if a set of that name exists with
// the same definition (the commit fails with EEXIST if it differs).
func (b *Batch) AddSet(s Set) {
	m := b.begin(msgNewSet, nl.Create, s.Family)
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
	m := b.begin(msgDelSet, 0, fam)
	b.enc.str(attrSetTable, table)
	b.enc.str(attrSetName, name)
	b.enc.endMessage(m)
}

// FlushSet deletes every element of a set.
func (b *Batch) FlushSet(fam Family, table, name string) {
	m := b.begin(msgDelSetElem, 0, fam)
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
	b.elements(msgNewSetElem, nl.Create, fam, table, set, elems)
}

// DelElements deletes elements (by key) from a set.
func (b *Batch) DelElements(fam Family, table, set string, elems []Element) {
	b.elements(msgDelSetElem, 0, fam, table, set, elems)
}

// elements adds elems in messages of at most about elemChunk bytes of
// elements each, going on filling the batch's last message when it is
// one of the same verb and set: elements added in several calls (for
// several owners, say) share messages as those of one call do.
func (b *Batch) elements(typ, flags uint16, fam Family, table, set string, elems []Element) {
	for len(elems) > 0 {
		e := b.elems
		if !b.fills(typ, fam, table, set) {
			off := b.begin(typ, flags, fam)
			b.enc.str(attrElemListTable, table)
			b.enc.str(attrElemListSet, set)
			e = elemsMessage{msg: len(b.msgs), off: off, list: b.enc.nest(attrElemListElems), typ: typ, fam: fam, table: table, set: set}
		}
		start, i := e.list+nl.AttrHeaderLen, 0
		for i < len(elems) && (e.n+i == 0 || len(b.enc.b)-start < elemChunk) {
			b.element(&elems[i])
			i++
		}
		e.n += i
		b.enc.endNest(e.list)
		b.enc.endMessage(e.off)
		b.elems = e
		elems = elems[i:]
	}
}

// fills reports whether the batch's last message is one of elements of
// the same kind and set, with room for more.
func (b *Batch) fills(typ uint16, fam Family, table, set string) bool {
	e := b.elems
	if e.msg == 0 || e.msg != len(b.msgs) {
		return false
	}
	return e.typ == typ && e.fam == fam && e.table == table && e.set == set &&
		len(b.enc.b)-(e.list+nl.AttrHeaderLen) < elemChunk
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

// describe returns the description of the message at the start of m,
// such as "add rule inet kproxy services (handle 7)": what it does, to
// which kind of object, the family, the table and the object's name, and
// a rule's handle or the number of elements.
func describe(m []byte) string {
	ms, err := nl.Split(m)
	if err != nil || len(ms) == 0 {
		return "malformed message"
	}
	typ, flags := ms[0].Type&0xff, ms[0].Flags
	fam, as, err := payload(ms[0].Data)
	if err != nil {
		return "malformed message"
	}
	// Every kind of message names its table with attribute 1; chains
	// are named by attribute 3, rules' chains, sets and element lists'
	// sets by attribute 2.
	nameAttr := uint16(attrRuleChain)
	if typ >= msgNewChain && typ <= msgDelChain {
		nameAttr = attrChainName
	}
	var table, name string
	var handle uint64
	elems := -1
	for _, a := range as {
		switch {
		case a.typ == attrTableName:
			table = a.str()
		case a.typ == nameAttr && typ >= msgNewChain:
			name = a.str()
		case a.typ == attrRuleHandle && (typ == msgNewRule || typ == msgDelRule):
			handle = a.u64()
		case a.typ == attrElemListElems && typ >= msgNewSetElem:
			list, _ := attributes(a.data)
			elems = len(list)
		}
	}
	verb, kind := "add", ""
	switch typ {
	case msgNewTable, msgDelTable:
		kind = "table"
	case msgNewChain, msgDelChain:
		kind = "chain"
	case msgNewRule, msgDelRule:
		kind = "rule"
	case msgNewSet, msgDelSet:
		kind = "set"
	case msgNewSetElem, msgDelSetElem:
		kind = "elements"
	default:
		return fmt.Sprintf("message type %d", ms[0].Type)
	}
	switch {
	case typ == msgNewRule && flags&nl.Replace != 0:
		verb = "replace"
	case typ == msgNewRule && flags&nl.Append == 0:
		verb = "insert"
	case typ == msgDelRule && handle == 0 && name == "":
		verb, kind = "flush", "table"
	case typ == msgDelRule && handle == 0:
		verb, kind = "flush", "chain"
	case typ == msgDelSetElem && elems < 0:
		verb, kind = "flush", "set"
	case typ == msgDelTable || typ == msgDelChain || typ == msgDelRule || typ == msgDelSet || typ == msgDelSetElem:
		verb = "delete"
	}
	var b strings.Builder
	b.WriteString(verb)
	b.WriteByte(' ')
	b.WriteString(kind)
	b.WriteByte(' ')
	b.WriteString(fam.String())
	if table != "" {
		b.WriteByte(' ')
		b.WriteString(table)
	}
	if name != "" {
		b.WriteByte(' ')
		b.WriteString(name)
	}
	switch {
	case handle != 0:
		fmt.Fprintf(&b, " (handle %d)", handle)
	case elems >= 0:
		b.WriteString(" (" + describeElems(elems) + ")")
	}
	return b.String()
}
