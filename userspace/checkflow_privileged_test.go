//go:build privileged

package userspace

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestCheckFlowReadsItsTables: the proxy's word on a flow names the
// listener that serves it, where the kernel has its socket bound, the
// held address and the endpoints the data path picks from; a port that
// rejects every flow has no listener; a listener someone broke, and an
// explanation of another state, are differences.
func TestCheckFlowReadsItsTables(t *testing.T) {
	h := netnstest.NewHost(t, "node")
	p, err := New(Options{NetNS: h.NS, HoldAddresses: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Cleanup(t.Context()); _ = p.Close() })
	node := servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	st := mustState(t, node, service(1, ep(0), weighted(3, ep(1))), service(2))
	mustSync(t, p, st)
	check := func(st *servicelb.State, p0 servicelb.Protocol, dst string) servicelb.KernelCheck {
		t.Helper()
		ex := st.Explain(servicelb.Flow{Protocol: p0, Src: netip.MustParseAddrPort("198.51.100.2:4000"), Dst: netip.MustParseAddrPort(dst)})
		kc, err := p.CheckFlow(t.Context(), &ex)
		require.NoError(t, err)
		require.Equal(t, "userspace", kc.Backend)
		return kc
	}
	kc := check(st, servicelb.TCP, "10.96.0.1:80")
	require.Empty(t, kc.Differences)
	read := strings.Join(kc.Read, "\n")
	assert.Contains(t, read, "listener tcp 10.96.0.1:80: socket bound to 10.96.0.1:80, serving the cluster IP")
	assert.Contains(t, read, "link lo: 10.96.0.1")
	assert.Contains(t, read, "endpoint "+netip.AddrPortFrom(epAddr(1), tcpTarget).String()+" weight 3")
	assert.Empty(t, check(st, servicelb.UDP, "10.96.0.1:53").Differences)

	kc = check(st, servicelb.TCP, "10.96.0.2:80")
	assert.Empty(t, kc.Differences)
	assert.Contains(t, kc.Read, "no listener tcp 10.96.0.2:80: the port rejects every flow, the kernel refuses them")
	assert.Equal(t, []string{"no listener tcp 10.96.0.9:80"}, check(st, servicelb.TCP, "10.96.0.9:80").Read)

	t.Run("an explanation of another state", func(t *testing.T) {
		other := mustState(t, node, service(1, ep(0)), service(2))
		assert.Contains(t, strings.Join(check(other, servicelb.TCP, "10.96.0.1:80").Differences, "\n"),
			"the explanation is of another state than the one applied")
	})
	t.Run("a broken listener", func(t *testing.T) {
		p.mu.Lock()
		p.listeners[listenKey{proto: servicelb.TCP, at: netip.MustParseAddrPort("10.96.0.1:80")}].broken.Store(true)
		p.mu.Unlock()
		assert.Contains(t, strings.Join(check(st, servicelb.TCP, "10.96.0.1:80").Differences, "\n"),
			"listener tcp 10.96.0.1:80 is broken")
	})
}
