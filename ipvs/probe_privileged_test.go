//go:build privileged || vm

package ipvs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestProbe: Probe agrees with a probe that writes what the Proxier
// writes (netnstest's): nil where the kernel has IPVS, ipset, nf_tables
// with nft_compat and dummy links (the VM), else a *servicelb.FeatureError
// (the host has no IPVS); and it refuses invalid options as New does.
func TestProbe(t *testing.T) {
	netnstest.Require(t, "root")
	h := netnstest.NewHost(t, "probe")
	err := Probe(Options{NetNS: h.NS})
	if why := netnstest.Missing(t, "ip_vs", "ipset", "nf_tables", "nft_compat", "dummy"); why == "" {
		require.NoError(t, err)
	} else {
		var fe *servicelb.FeatureError
		require.ErrorAs(t, err, &fe, "the kernel lacks %s", why)
		require.ErrorIs(t, err, servicelb.ErrNotSupported)
		t.Logf("the kernel lacks %s; Probe: %v", why, err)
	}
	require.ErrorIs(t, Probe(Options{NetNS: h.NS, Interface: "a name far too long for a link"}), servicelb.ErrInvalidOptions)
}
