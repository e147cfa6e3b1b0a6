//go:build linux

package nfnl

import (
	"encoding/binary"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// RefuseRules makes every later Commit send the rules it adds, inserts or
// replaces for the owners refuse chooses (Batch.SetOwner) with the name of
// their chain changed to one that no chain has, so that the kernel refuses
// each of them (ENOENT), as it refuses a rule it cannot load, and the
// elements it adds for them with a key the kernel cannot read (EINVAL);
// nil ends it.
// The batch itself is left as it was. A test sets it, to see what a caller
// makes of the real kernel refusing what it wrote for one owner; nothing
// else should.
func (c *Conn) RefuseRules(refuse func(owner any) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse = refuse
}

// misnameRules changes the chain name of the rule messages of the owners
// refuse chooses, and returns what puts them back.
func (b *Batch) misnameRules(refuse func(any) bool) (restore func()) {
	type change struct {
		at  int
		was byte
	}
	var changes []change
	for i, off := range b.msgs {
		if nl.TypeOf(b.at(int(off))) == subsysNFTables<<8|msgNewSetElem {
			for _, at := range b.refusedKeys(i, refuse) {
				c := b.at(at)
				changes = append(changes, change{at, c[0]})
				c[0] = attrDataVerdict
			}
			continue
		}
		if nl.TypeOf(b.at(int(off))) != subsysNFTables<<8|msgNewRule || !refuse(b.soleOwner(int(off), b.msgEnd(i))) {
			continue
		}
		at := b.attrData(i, attrRuleChain)
		if at < 0 || at >= b.msgEnd(i) {
			continue
		}
		c := b.at(at)
		changes = append(changes, change{at, c[0]})
		c[0] = '#'
		if changes[len(changes)-1].was == '#' {
			c[0] = '%'
		}
	}
	return func() {
		for _, c := range changes {
			b.at(c.at)[0] = c.was
		}
	}
}

// refusedKeys returns, for each element of message i (a message of
// elements) that an owner refuse chooses holds, the offset of the low
// byte of the type of its key's value: made a verdict's, the kernel
// refuses the element.
func (b *Batch) refusedKeys(i int, refuse func(any) bool) []int {
	list := b.attrData(i, attrElemListElems)
	if list < 0 {
		return nil
	}
	end := list - nl.AttrHeaderLen + int(binary.NativeEndian.Uint16(b.at(list-nl.AttrHeaderLen)))
	var out []int
	for off := list; off+nl.AttrHeaderLen <= end; {
		n := int(binary.NativeEndian.Uint16(b.at(off)))
		if n < nl.AttrHeaderLen {
			break
		}
		if refuse(b.ownerAt(off)) {
			for a := off + nl.AttrHeaderLen; a+nl.AttrHeaderLen <= off+n; {
				h := b.at(a)
				an, typ := int(binary.NativeEndian.Uint16(h)), binary.NativeEndian.Uint16(h[2:])&0x3fff
				if an < nl.AttrHeaderLen {
					break
				}
				if typ == attrElemKey {
					out = append(out, a+nl.AttrHeaderLen+2)
					break
				}
				a += nl.Align(an)
			}
		}
		off += nl.Align(n)
	}
	return out
}

// attrData returns the offset of the value of message i's top-level
// attribute typ, or -1.
func (b *Batch) attrData(i int, typ uint16) int {
	start := int(b.msgs[i]) + nl.HeaderLen + nfgenLen
	as, err := attributes(b.at(start)[:b.msgEnd(i)-start])
	if err != nil {
		return -1
	}
	off := start
	for _, a := range as {
		if a.typ == typ {
			return off + nl.AttrHeaderLen
		}
		off += nl.Align(nl.AttrHeaderLen + len(a.data))
	}
	return -1
}
