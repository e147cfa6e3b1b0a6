package suite

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// capabilities returns the capabilities of a kproxy column's backend, as
// the kproxy binary runs it.
func capabilities(t *testing.T, proxy string) servicelb.Capabilities {
	t.Helper()
	switch proxy {
	case "kproxy-userspace":
		p, err := userspace.New(userspace.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		return p.Capabilities()
	case "kproxy-ebpf":
		nft, err := nftables.ForRendering(nftables.Options{})
		require.NoError(t, err)
		p, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup", Packets: nft})
		require.NoError(t, err)
		return p.Capabilities()
	}
	t.Fatalf("no declared limit may name %s: only a backend that lacks a feature declares one", proxy)
	return servicelb.Capabilities{}
}

// TestLimitsAreDeclared checks that every limit the report accepts is one
// the backend declares: the capability it names is one the backend's
// Capabilities lack, so the conformance kit and its users know it too.
func TestLimitsAreDeclared(t *testing.T) {
	for _, l := range Limits {
		caps := capabilities(t, l.Proxy)
		assert.NotZero(t, l.Feature, "%s: %s names no feature", l.Proxy, l.Spec)
		assert.False(t, caps.Features.Has(l.Feature), "%s declares %v, which it has: %s", l.Proxy, l.Feature, l.Spec)
		assert.NotEmpty(t, l.Why)
	}
}
