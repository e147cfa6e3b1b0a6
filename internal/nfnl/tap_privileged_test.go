//go:build privileged

package nfnl_test

import (
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// A batch a tap saw, committed with a generation check, replays in another
// namespace into the same table, set and elements; a replay the kernel
// refuses is an error.
func TestTapReplay(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	a, b := open(t, netnstest.NewHost(t, "tapa")), open(t, netnstest.NewHost(t, "tapb"))
	gen, err := a.Generation(ctx(t))
	require.NoError(t, err)
	var batch nfnl.Batch
	batch.RequireGeneration(gen.ID)
	batch.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "tap"})
	batch.AddSet(nfnl.Set{Family: nfnl.IPv4, Table: "tap", Name: "s", KeyType: 7, KeyLen: 4})
	batch.AddElements(nfnl.IPv4, "tap", "s", []nfnl.Element{{Key: []byte{10, 1, 2, 3}}})
	var frames [][]byte
	tctx := nfnl.WithTap(ctx(t), func(f []byte) { frames = append(frames, slices.Clone(f)) })
	_, err = a.Commit(tctx, &batch)
	require.NoError(t, err)
	require.Len(t, frames, 1)

	require.NoError(t, b.Replay(ctx(t), frames[0]))
	els, err := b.Elements(ctx(t), nfnl.IPv4, "tap", "s")
	require.NoError(t, err)
	require.Len(t, els, 1)
	require.Equal(t, []byte{10, 1, 2, 3}, els[0].Key)

	// Without the tap, nothing more is seen.
	var none nfnl.Batch
	none.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "other"})
	_, err = a.Commit(ctx(t), &none)
	require.NoError(t, err)
	require.Len(t, frames, 1)

	// A replay the kernel refuses is an error: deleting the table twice.
	var del nfnl.Batch
	del.DelTable(nfnl.IPv4, "tap")
	_, err = a.Commit(tctx, &del)
	require.NoError(t, err)
	require.Len(t, frames, 2)
	require.NoError(t, b.Replay(ctx(t), frames[1]))
	require.ErrorIs(t, b.Replay(ctx(t), frames[1]), syscall.ENOENT)
}

// WithRequests sees each round trip a call makes, by kind: a commit (its
// generation read included), a generation read, a read of objects; an
// empty batch is a generation read.
func TestRequests(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	c := open(t, netnstest.NewHost(t, "requests"))
	var seen []string
	rctx := nfnl.WithRequests(ctx(t), func(r nfnl.Request) { seen = append(seen, r.String()) })
	var b nfnl.Batch
	b.AddTable(nfnl.Table{Family: nfnl.IPv4, Name: "requests"})
	_, err := c.Commit(rctx, &b)
	require.NoError(t, err)
	_, err = c.Generation(rctx)
	require.NoError(t, err)
	_, err = c.Table(rctx, nfnl.IPv4, "requests")
	require.NoError(t, err)
	_, err = c.Sets(rctx, nfnl.IPv4, "requests")
	require.NoError(t, err)
	_, err = c.Commit(rctx, &nfnl.Batch{})
	require.NoError(t, err)
	require.Equal(t, []string{"commit", "generation", "read", "read", "generation"}, seen)
	_, err = c.Generation(ctx(t))
	require.NoError(t, err)
	require.Len(t, seen, 5, "without the function, nothing is seen")
}
