//go:build linux

package nfnl

import (
	"github.com/kproxy-dev/kproxy/internal/nl"
)

// RefuseRules makes every later Commit send the rules it adds, inserts or
// replaces for the owners refuse chooses (Batch.SetOwner) with the name of
// their chain changed to one that no chain has, so that the kernel refuses
// each of them (ENOENT), as it refuses a rule it cannot load; nil ends it.
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
