package servicelb_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestRunnerSetNode: a new node (here, an address added to an interface)
// is a change like a service's: the next sync comes MinSyncInterval after
// the last and serves the node port on the new address. A node that is
// not valid is refused and schedules nothing.
func TestRunnerSetNode(t *testing.T) {
	h, src := newHarness(t, "s")
	h.idle()
	s := svc("a", 1)
	s.Ports[0].NodePort = 30080
	require.NoError(t, src[0].Upsert(s))
	h.idle()
	src[0].Synced()
	h.idle()
	require.Equal(t, 1, h.syncs())

	node := servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		LocalIPs: []netip.Addr{netip.MustParseAddr("198.51.100.9")}}
	require.NoError(t, h.r.SetNode(node))
	assert.Equal(t, minI, h.idle(), "a node change waits MinSyncInterval as any change")
	h.clk.Advance(minI)
	h.idle()
	require.Equal(t, 2, h.syncs())
	st := h.p.Records()[1].State
	ports := st.Ports()
	require.Len(t, ports, 1)
	assert.Equal(t, node.NodePortIPs(servicelb.IPv4), ports[0].NodeIPs)
	assert.Len(t, ports[0].NodeIPs, 2)

	require.NoError(t, h.r.SetNode(node), "the same node again")
	assert.True(t, h.r.Health().QueuedAt.IsZero(), "the same node queued a change")

	bad := node
	bad.LocalIPs = []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	require.ErrorIs(t, h.r.SetNode(bad), servicelb.ErrInvalidAddress)
	assert.Equal(t, node.LocalIPs, h.r.State().Node().LocalIPs, "a refused node was taken")
}
