//go:build privileged

package nfnl_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// TestTraceFollowsAPacket: a Tracer marks the packets its match selects,
// and hands the events of the next one in the kernel's order, its own
// table's left out: the rule that matched in another table, with its
// verdict, and the base chain's policy; Close removes its table, and a
// packet the match leaves alone is not traced.
func TestTraceFollowsAPacket(t *testing.T) {
	h := netnstest.NewHost(t, "trace")
	h.ExecInput(t, `table inet other {
	chain out {
		type filter hook output priority 0; policy accept;
		udp dport 9999 counter
		udp dport 9999 accept
	}
}
`, "nft", "-f", "-")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	tr, err := nfnl.StartTrace(ctx, nfnl.Options{NetNS: int(h.NS)}, "trace-test",
		nfnl.TraceMatch{Dst: netip.MustParseAddrPort("127.0.0.1:9999"), Proto: 17})
	require.NoError(t, err)
	send := func(port string) {
		require.NoError(t, h.Do(func() error {
			c, err := net.Dial("udp", "127.0.0.1:"+port)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("x"))
			return err
		}))
	}
	send("9998") // not selected
	send("9999")
	evs, err := tr.Next(ctx)
	require.NoError(t, err)
	require.NoError(t, tr.Close())
	require.NotEmpty(t, evs)
	var steps []string
	for _, ev := range evs {
		assert.Equal(t, evs[0].ID, ev.ID, "one packet's events")
		steps = append(steps, ev.Table+" "+ev.Chain+" "+ev.VerdictText())
	}
	assert.Equal(t, []string{"other out continue", "other out accept"}, steps[:2])
	for _, ev := range evs {
		assert.NotEqual(t, "trace-test", ev.Table, "the marking table's own events")
	}
	out := h.Exec(t, "nft", "list", "tables")
	assert.NotContains(t, out, "trace-test", "the marking table outlives Close")
}
