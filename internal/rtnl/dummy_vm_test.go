//go:build vm

package rtnl_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestDummyOwnership: EnsureDummy creates a missing dummy link marked as
// its owner's, and finds it again without creating it; RemoveDummy
// deletes it for that owner only. A dummy link someone else made is
// found, never marked, and left by RemoveDummy.
func TestDummyOwnership(t *testing.T) {
	netnstest.Require(t, "dummy")
	h := netnstest.NewHost(t, "rtnl")
	c := open(t, h)

	l, created, err := c.EnsureDummy(t.Context(), "kproxy-t0", "kproxy-test")
	require.NoError(t, err)
	assert.True(t, created)
	assert.Equal(t, "dummy", l.Kind)
	assert.True(t, l.OwnedBy("kproxy-test"))
	assert.Contains(t, h.Exec(t, "ip", "link", "show", "kproxy-t0"), "alias kproxy-test")
	require.NoError(t, c.SetUp(t.Context(), l))
	again, created, err := c.EnsureDummy(t.Context(), "kproxy-t0", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, l.Index, again.Index)
	assert.True(t, again.Up())

	deleted, err := c.RemoveDummy(t.Context(), "kproxy-t0", "someone-else")
	require.NoError(t, err)
	assert.False(t, deleted, "another owner's link")
	deleted, err = c.RemoveDummy(t.Context(), "kproxy-t0", "kproxy-test")
	require.NoError(t, err)
	assert.True(t, deleted)
	_, ok, err := c.LinkByName(t.Context(), "kproxy-t0")
	require.NoError(t, err)
	assert.False(t, ok)
	deleted, err = c.RemoveDummy(t.Context(), "kproxy-t0", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, deleted, "gone already")

	h.Exec(t, "ip", "link", "add", "kproxy-t1", "type", "dummy")
	l, created, err = c.EnsureDummy(t.Context(), "kproxy-t1", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, created)
	assert.False(t, l.OwnedBy("kproxy-test"))
	errs, err := c.ChangeAddrs(t.Context(), l.Index, 0x6b, []rtnl.AddrOp{{Add: true, Prefix: rtnl.Host(netip.MustParseAddr("10.96.0.1"))}})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	deleted, err = c.RemoveDummy(t.Context(), "kproxy-t1", "kproxy-test")
	require.NoError(t, err)
	assert.False(t, deleted)
	assert.Contains(t, h.Exec(t, "ip", "address", "show", "dev", "kproxy-t1"), "10.96.0.1/32")
}
