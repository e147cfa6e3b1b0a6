//go:build linux

package nfnl

import (
	"errors"
	"syscall"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }

// A batch knows whose each message is, and for a message of elements
// that several owners share, whose each element is: elements of one set
// added in several calls fill the same message.
func TestBatchOwners(t *testing.T) {
	var b Batch
	b.AddTable(Table{Family: Inet, Name: "t"})
	b.SetOwner("a")
	b.AddChain(Chain{Family: Inet, Table: "t", Name: "a"})
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "a", Exprs: accept()})
	b.SetOwner("b")
	b.SetOwner("c") // replaces b: nothing was added for b
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "c", Exprs: accept()})
	b.SetOwner("a")
	b.AddElements(Inet, "t", "s", []Element{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}}})
	b.SetOwner("c")
	b.AddElements(Inet, "t", "s", []Element{{Key: []byte{10, 0, 0, 3}}})
	b.SetOwner(nil)
	b.AddElements(Inet, "t", "other", []Element{{Key: []byte{10, 0, 0, 4}}})
	b.SetOwner("c")
	b.AddElements(Inet, "t", "s", []Element{{Key: []byte{10, 0, 0, 5}}})
	require.NoError(t, b.Err())
	assert.Equal(t, `add table inet t
add chain inet t a
add rule inet t a
add rule inet t c
add elements inet t s (3 elements)
add elements inet t other (1 element)
add elements inet t s (1 element)
`, b.String())
	assert.Len(t, messagesOf(t, &b), b.Len())

	owners := make([]any, b.Len())
	for i := range owners {
		owners[i] = b.Owner(i)
	}
	assert.Equal(t, []any{nil, "a", "a", "c", nil, nil, "c"}, owners, "a message of several owners' elements has none")
	assert.Nil(t, b.Owner(7))

	// The kernel points at an element: its owner. At the message's table
	// or set, which every element shares: none.
	elems := b.attrData(4, attrElemListElems)
	require.Positive(t, elems)
	list, err := attributes(b.at(elems)[:b.msgEnd(4)-elems])
	require.NoError(t, err)
	require.Len(t, list, 3)
	off := elems - int(b.msgs[4])
	assert.Equal(t, "a", b.ownerOf(4, off))
	third := off + 2*nl.Align(nl.AttrHeaderLen+len(list[0].data))
	assert.Equal(t, "c", b.ownerOf(4, third))
	assert.Nil(t, b.ownerOf(4, nl.HeaderLen+nfgenLen))
	assert.Equal(t, "c", b.ownerOf(6, nl.HeaderLen+nfgenLen), "a message of one owner's elements is its, wherever the kernel points")
}

// A failure names the failed message's owner, and RefusedOwners groups
// the failures by owner when every failed message has one of the type
// asked for.
func TestRefusedOwners(t *testing.T) {
	var b Batch
	b.SetOwner("a")
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "a", Exprs: accept()})
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "a", Exprs: accept()})
	b.SetOwner("b")
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "b", Exprs: accept()})
	b.SetOwner(nil)
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "shared", Exprs: accept()})

	e := b.commitError([]*MessageError{b.failure(0, syscall.ENOENT, "", 0), b.failure(1, syscall.ENOENT, "", 0), b.failure(2, syscall.EINVAL, "", 0)})
	require.ErrorIs(t, e, syscall.ENOENT)
	var ce *CommitError
	require.ErrorAs(t, e, &ce)
	assert.Equal(t, []any{"a", "a", "b"}, []any{ce.Failed[0].Owner, ce.Failed[1].Owner, ce.Failed[2].Owner})

	got := RefusedOwners[string](errors.Join(errors.New("write"), e))
	require.Len(t, got, 2)
	assert.ErrorIs(t, got["a"], syscall.ENOENT)
	assert.NotErrorIs(t, got["a"], syscall.EINVAL)
	assert.ErrorIs(t, got["b"], syscall.EINVAL)
	assert.Contains(t, got["a"].Error(), "add rule inet t a: no such file or directory (and 1 more failed message)")

	assert.Nil(t, RefusedOwners[int](e), "owners of another type")
	shared := b.commitError([]*MessageError{b.failure(0, syscall.ENOENT, "", 0), b.failure(3, syscall.ENOENT, "", 0)})
	assert.Nil(t, RefusedOwners[string](shared), "a message of no owner failed too")
	whole := b.commitError([]*MessageError{b.failure(-1, syscall.EINVAL, "", 0)})
	assert.Nil(t, RefusedOwners[string](whole), "the commit as a whole failed")
	assert.Nil(t, RefusedOwners[string](syscall.ENOENT))
}

// RefuseRules' misnaming changes the chain of the chosen owners'
// rules, and nothing else, until it is undone.
func TestMisnameRules(t *testing.T) {
	var b Batch
	b.SetOwner("a")
	b.AddChain(Chain{Family: Inet, Table: "t", Name: "a"})
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "a", Exprs: accept()})
	b.SetOwner("b")
	b.AddRule(Rule{Family: Inet, Table: "t", Chain: "b", Exprs: accept()})
	b.DelRule(Inet, "t", "b", 7)
	before := append([]byte(nil), b.enc.b...) // one chunk
	chain := func(i int) string {
		at := b.attrData(i, attrRuleChain)
		require.Positive(t, at)
		return string(b.at(at)[:1])
	}
	restore := b.misnameRules(func(o any) bool { return o == "b" })
	assert.Equal(t, "a", chain(1))
	assert.Equal(t, "#", chain(2))
	assert.Equal(t, "b", chain(3), "a deletion is left alone")
	restore()
	assert.Equal(t, before, b.enc.b)
}
