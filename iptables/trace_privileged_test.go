//go:build privileged || vm

package iptables

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTraceFollowsAPacket: a trace of a flow from outside to a cluster IP
// follows its first packet from the builtin chain's jump through the
// proxier's chains, each rule as iptables-save writes it, to the
// endpoint's DNAT; the marking table is gone afterwards.
func TestTraceFollowsAPacket(t *testing.T) {
	e := newEnv(t, servicelb.IPv4)
	cip := netip.MustParseAddr("10.96.0.10")
	st := e.sync(servicelb.Service{Name: "default/web", ClusterIPs: []netip.Addr{cip},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: tcpPort}},
		Endpoints: []servicelb.Endpoint{e.endpoint(0, false)}})
	sp := st.Ports()[0]
	dst := netip.AddrPortFrom(cip, 80)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type result struct {
		tr  servicelb.Trace
		err error
	}
	done := make(chan result, 1)
	go func() {
		tr, err := e.px.Trace(ctx, servicelb.Flow{Protocol: servicelb.TCP, Src: netip.AddrPortFrom(e.tp.Client.IPv4, 0), Dst: dst})
		done <- result{tr, err}
	}()
	require.Eventually(t, func() bool {
		out, err := e.tp.Node.Output(ctx, "", "nft", "list", "table", "inet", traceTable)
		return err == nil && strings.Contains(out, "nftrace set 1")
	}, 10*time.Second, 20*time.Millisecond, "the marking table")
	_, err := e.tp.Client.Ask(ctx, "tcp", dst)
	require.NoError(t, err)
	r := <-done
	require.NoError(t, r.err)
	text := r.tr.Text()
	t.Log(text)
	assert.Equal(t, "iptables", r.tr.Backend)
	assert.Regexp(t, `ip nat PREROUTING: .*-j `+e.px.n.fixed(chainServices)+` -> jump `+e.px.n.fixed(chainServices), text)
	assert.Contains(t, text, "ip nat "+e.px.n.fixed(chainServices)+": ")
	assert.Contains(t, text, "-> jump "+e.px.n.svc(sp))
	assert.Regexp(t, `-j DNAT --to-destination 10\.244\.1\.2:8080 -> accept`, text)
	assert.Contains(t, text, "ip nat "+e.px.n.fixed(chainMarkMasq)+": (end of chain) -> return", "from outside: marked for masquerade")
	assert.Regexp(t, `ip nat `+e.px.n.fixed(chainPostrouting)+`: .*-j MASQUERADE --random-fully -> accept`, text)
	out, err := e.tp.Node.Output(t.Context(), "", "nft", "list", "tables")
	require.NoError(t, err)
	assert.NotContains(t, out, traceTable, "the marking table outlives the trace")
}
