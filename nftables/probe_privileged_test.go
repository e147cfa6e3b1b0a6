//go:build privileged || vm

package nftables_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestProbe: Probe finds nf_tables in a namespace that has it, changing
// nothing there, and refuses invalid options as New does.
func TestProbe(t *testing.T) {
	netnstest.Require(t, "nf_tables")
	h := netnstest.NewHost(t, "probe")
	before := h.Exec(t, "nft", "list", "ruleset")
	require.NoError(t, nftables.Probe(nftables.Options{NetNS: h.NS}))
	assert.Equal(t, before, h.Exec(t, "nft", "list", "ruleset"), "Probe changed the ruleset")

	err := nftables.Probe(nftables.Options{NetNS: h.NS, Table: "no spaces allowed"})
	require.ErrorIs(t, err, servicelb.ErrInvalidOptions)
}
