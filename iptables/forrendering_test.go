//go:build linux

package iptables_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestForRendering: a Proxier for rendering renders what Render renders,
// declares the families of its options, and refuses to sync or clean up.
func TestForRendering(t *testing.T) {
	o := iptables.Options{Families: []servicelb.Family{servicelb.IPv6}}
	p, err := iptables.ForRendering(o)
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, []servicelb.Family{servicelb.IPv6}, p.Capabilities().Families)
	st, err := servicelb.NewState(servicelb.NodeConfig{})
	require.NoError(t, err)
	got, err := p.Render(st)
	require.NoError(t, err)
	want, err := iptables.Render(st, o)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.ErrorIs(t, servicetest.SyncErr(p.Sync(context.Background(), st)), iptables.ErrRenderOnly)
	assert.ErrorIs(t, p.Cleanup(context.Background()), iptables.ErrRenderOnly)

	_, err = iptables.ForRendering(iptables.Options{ChainPrefix: "not a prefix"})
	assert.ErrorIs(t, err, iptables.ErrInvalidOptions)
}

// TestConntrackTCPLiberal: the forward chain drops what conntrack calls
// invalid, unless the node's conntrack is liberal, as kube-proxy's
// iptables mode does under --conntrack-tcp-be-liberal.
func TestConntrackTCPLiberal(t *testing.T) {
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "n"})
	require.NoError(t, err)
	const drop = "-A KPROXY-FORWARD -m conntrack --ctstate INVALID -j DROP"
	strict, err := iptables.Render(st, iptables.Options{})
	require.NoError(t, err)
	assert.Contains(t, strict, drop)
	liberal, err := iptables.Render(st, iptables.Options{ConntrackTCPLiberal: true})
	require.NoError(t, err)
	assert.NotContains(t, liberal, "INVALID")
	assert.Contains(t, liberal, "-A KPROXY-FORWARD -m comment --comment \"kubernetes forwarding rules\"")
}
