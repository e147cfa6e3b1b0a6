//go:build privileged

package userspace

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestProbe: holding addresses in a namespace of its own, Probe reads the
// namespace's links and finds what it needs; invalid options are refused
// as New refuses them.
func TestProbe(t *testing.T) {
	netnstest.Require(t, "root")
	h := netnstest.NewHost(t, "probe")
	require.NoError(t, Probe(Options{NetNS: h.NS, HoldAddresses: true}))
	require.ErrorIs(t, Probe(Options{NetNS: h.NS, StrictARP: true}), servicelb.ErrInvalidOptions)
}
