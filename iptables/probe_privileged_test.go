//go:build privileged || vm

package iptables

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestProbe: Probe asks for nf_tables and every extension the rules call
// and agrees with a probe that writes them (netnstest's); it changes
// nothing, and refuses invalid options as New does.
func TestProbe(t *testing.T) {
	netnstest.Require(t, "root")
	h := netnstest.NewHost(t, "probe")
	before := h.Exec(t, "nft", "list", "ruleset")
	err := Probe(Options{NetNS: h.NS})
	if why := netnstest.Missing(t, "nf_tables", "nft_compat", "nat"); why == "" {
		require.NoError(t, err)
	} else {
		var fe *servicelb.FeatureError
		require.ErrorAs(t, err, &fe, "the kernel lacks %s", why)
		require.ErrorIs(t, err, servicelb.ErrNotSupported)
	}
	assert.Equal(t, before, h.Exec(t, "nft", "list", "ruleset"), "Probe changed the ruleset")

	require.ErrorIs(t, Probe(Options{NetNS: h.NS, DropBit: 40}), servicelb.ErrInvalidOptions)
}
