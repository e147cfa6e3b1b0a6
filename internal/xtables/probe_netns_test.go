//go:build privileged || vm

package xtables

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestProbeAsksForEachExtension: the kernel answers for every extension
// the encoder writes, and not for one it does not have, nor for one at a
// revision it does not know.
func TestProbeAsksForEachExtension(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	h := netnstest.NewHost(t, "xtprobe")
	feature, err := Probe(t.Context(), int(h.NS), false)
	require.NoError(t, err, feature)

	c, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.Extension(t.Context(), nfnl.IPv4, "comment", 0, false))
	require.Error(t, c.Extension(t.Context(), nfnl.IPv4, "kproxy-none", 0, false), "a match the kernel has not")
	require.Error(t, c.Extension(t.Context(), nfnl.IPv4, "comment", 9, false), "a revision the kernel has not")
	require.Error(t, c.Extension(t.Context(), nfnl.IPv4, "comment", 0, true), "a match asked for as a target")
}
