//go:build privileged || vm

package nftables_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestTraceFollowsAPacket: a trace of a flow from outside to a cluster IP
// follows its first packet through the table's chains, each rule named as
// Render writes it, from the dispatch map to the service's chain and the
// translation to the endpoint; the marking table is gone afterwards.
func TestTraceFollowsAPacket(t *testing.T) {
	l := newLab(t, 1, nftables.Options{})
	l.sync(t, webService(endpoints("elsewhere", 0)...))
	dst := netip.AddrPortFrom(clusterIP4, 80)
	flow := servicelb.Flow{Protocol: servicelb.TCP, Src: netip.AddrPortFrom(l.tp.Client.IPv4, 0), Dst: dst}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan servicelb.Trace, 1)
	errs := make(chan error, 1)
	go func() {
		tr, err := l.p.Trace(ctx, flow)
		errs <- err
		done <- tr
	}()
	// Ask once the marking table is there, and again until the trace ends.
	require.Eventually(t, func() bool {
		out, err := l.tp.Node.Output(ctx, "", "nft", "list", "table", "inet", nftables.DefaultTable+"-trace")
		return err == nil && strings.Contains(out, "nftrace set 1")
	}, 10*time.Second, 20*time.Millisecond, "the marking table")
	_, err := l.tp.Client.Ask(ctx, "tcp", dst)
	require.NoError(t, err)
	require.NoError(t, <-errs)
	tr := <-done
	text := tr.Text()
	t.Log(text)
	assert.Equal(t, "nftables", tr.Backend)
	assert.Regexp(t, `inet kproxy services: ip daddr . meta l4proto . th dport @verdicts4/[a-z/-]+ goto verdicts4/[a-z/-]+ -> goto verdicts4/`, text)
	assert.Contains(t, text, "inet kproxy mark-for-masquerade: (end of chain) -> return", "from outside: marked for masquerade")
	assert.Regexp(t, `inet kproxy cluster4: .*dnat ip to ip daddr . meta l4proto . th dport . numgen random mod \d+ map @endpoints4 -> accept`, text)
	assert.Contains(t, text, "inet kproxy masquerading: masquerade fully-random -> accept")
	out, err := l.tp.Node.Output(t.Context(), "", "nft", "list", "tables")
	require.NoError(t, err)
	assert.NotContains(t, out, nftables.DefaultTable+"-trace", "the marking table outlives the trace")
}
