//go:build privileged

package nfnl_test

import (
	"syscall"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// The kernel's refusals name their owners: an element the kernel refuses
// in a message of several owners' elements is its owner's, and a rule
// that RefuseRules has the kernel refuse is its owner's. Nothing of the
// batch is applied.
func TestRefusalsNameOwners(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "nfnl")
	c := open(t, h)
	ctx := ctx(t)
	if _, err := c.Commit(ctx, sample()); err != nil {
		t.Fatal(err)
	}
	before := h.Exec(t, "nft", "list", "ruleset")

	var b nfnl.Batch
	b.SetOwner("good")
	b.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 0, 7}}, {Key: []byte{10, 0, 0, 8}}})
	b.SetOwner("bad")
	b.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 9}}}) // a key of 3 bytes
	b.SetOwner("good")
	b.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 0, 9}}})
	require.Equal(t, 1, b.Len(), "the owners' elements share one message")
	_, err := c.Commit(ctx, &b)
	var ce *nfnl.CommitError
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Failed, 1)
	assert.Equal(t, "bad", ce.Failed[0].Owner, "the kernel pointed at the element of %v", ce.Failed[0])
	assert.Equal(t, syscall.EINVAL, ce.Failed[0].Errno)
	got := nfnl.RefusedOwners[string](err)
	require.Len(t, got, 1)
	assert.ErrorIs(t, got["bad"], syscall.EINVAL)

	var r nfnl.Batch
	r.SetOwner("good")
	r.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "svc", Exprs: []expr.Any{&expr.Counter{}}})
	r.SetOwner("bad")
	r.AddRule(nfnl.Rule{Family: nfnl.Inet, Table: tbl, Chain: "other", Exprs: []expr.Any{&expr.Counter{}}})
	r.SetOwner(nil)
	r.AddElements(nfnl.Inet, tbl, "addrs", []nfnl.Element{{Key: []byte{10, 0, 0, 6}}})
	c.RefuseRules(func(o any) bool { return o == "bad" })
	_, err = c.Commit(ctx, &r)
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Failed, 1)
	assert.Equal(t, "bad", ce.Failed[0].Owner)
	assert.Equal(t, syscall.ENOENT, ce.Failed[0].Errno)
	assert.Equal(t, "add rule inet t other", ce.Failed[0].Op)
	assert.Equal(t, before, h.Exec(t, "nft", "list", "ruleset"), "a refused batch changed the ruleset")

	// Without the fault the same batch goes in.
	c.RefuseRules(nil)
	_, err = c.Commit(ctx, &r)
	require.NoError(t, err)
}
