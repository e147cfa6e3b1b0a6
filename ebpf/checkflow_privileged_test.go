//go:build privileged || vm

package ebpf_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestCheckFlowReadsTheMaps: the kernel's word on a flow names the
// frontend's entry and its set's slots as the maps hold them (an endpoint
// of weight 2 in two slots); a flow of no frontend meets no entry; an
// explanation of another state is a difference.
func TestCheckFlowReadsTheMaps(t *testing.T) {
	e := newEnv(t)
	h := netnstest.NewHost(t, "node")
	p := newSocketLB(t, e, h.NS, false)
	t.Cleanup(func() {
		assert.NoError(t, p.Cleanup(t.Context()))
		assert.NoError(t, p.Close())
	})
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	web := servicelb.Service{Name: "d/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2"), Weight: servicelb.Weight(2)},
			{Addr: netip.MustParseAddr("10.244.2.2")}}}
	st, err := servicelb.NewState(node, web)
	require.NoError(t, err)
	require.NoError(t, servicetest.SyncErr(p.Sync(t.Context(), st)))
	check := func(st *servicelb.State, dst string) servicelb.KernelCheck {
		t.Helper()
		ex := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("10.244.9.9:4000"), Dst: netip.MustParseAddrPort(dst)})
		kc, err := p.CheckFlow(t.Context(), &ex)
		require.NoError(t, err)
		require.Equal(t, "ebpf", kc.Backend)
		return kc
	}
	kc := check(st, "10.96.0.10:80")
	require.Empty(t, kc.Differences)
	read := strings.Join(kc.Read, "\n")
	assert.Contains(t, read, "kp_frontends: 10.96.0.10:80/tcp: node ")
	assert.Regexp(t, `kp_sets: set \d+ \(d/web:http/ipv4 cluster\), 3 slots, timeout 0 s: `, read)
	assert.Equal(t, 2, strings.Count(read, "10.244.1.2:8080"), "weight 2: two slots")
	assert.Equal(t, []string{"kp_frontends: no entry 10.96.0.99:80/tcp"}, check(st, "10.96.0.99:80").Read)

	web.Endpoints = web.Endpoints[:1]
	other, err := servicelb.NewState(node, web)
	require.NoError(t, err)
	assert.Contains(t, strings.Join(check(other, "10.96.0.10:80").Differences, "\n"),
		"the explanation is of another state than the one applied")
}
