//go:build privileged

package nftables_test

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
)

// The tables of testdata/previous are what the previous layout of the
// table (a chain per service port, the endpoints of each in hash ranges
// of sharded interval maps) wrote for the golden states, and, in
// upgrade.nft, for the state of TestUpgradeKeepsEveryConnection.

// TestAdoptsThePreviousLayout: a table the previous layout wrote is
// adopted by the first sync, which leaves it what a fresh table of the
// state is; the next sync sends nothing.
func TestAdoptsThePreviousLayout(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	for name, mk := range nftables.GoldenCases() {
		t.Run(name, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("testdata", "previous", name+".nft"))
			require.NoError(t, err)
			fresh, h := netnstest.NewHost(t, "fresh"), netnstest.NewHost(t, "previous")
			st := mk(t)
			mustSync(t, newProxier(t, fresh, nftables.Options{}), st)
			h.ExecInput(t, string(text), "nft", "-f", "-")
			p := newProxier(t, h, nftables.Options{})
			mustSync(t, p, st)
			if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
				t.Fatalf("adopted table differs from a fresh one (-fresh +adopted):\n%s", diff)
			}
			gen := generation(t, h)
			mustSync(t, p, st)
			assert.Equal(t, gen, generation(t, h), "a second sync committed")
		})
	}
}

// TestUpgradeKeepsEveryConnection: a Proxier of this layout takes over a
// table of the previous one, with a connection open through it and new
// connections opened without pause across the sync: the open one keeps
// working, and no new one fails.
func TestUpgradeKeepsEveryConnection(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	tp, st := longService(t)
	text, err := os.ReadFile(filepath.Join("testdata", "previous", "upgrade.nft"))
	require.NoError(t, err)
	tp.Node.ExecInput(t, string(text), "nft", "-f", "-")
	dst := netip.AddrPortFrom(clusterIP4, 80)
	conn := dialLong(t, tp.Client, dst)
	talk(t, conn, "before")

	dials := netnstest.Repeat(t, func() error {
		return tp.Client.Do(func() error {
			c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
	})
	require.Eventually(t, func() bool { return dials.Runs() >= 20 }, 10*time.Second, 5*time.Millisecond, "connections before the upgrade")
	before := dials.Runs()
	p := newProxier(t, tp.Node, nftables.Options{})
	mustSync(t, p, st)
	require.Eventually(t, func() bool { return dials.Runs() >= before+20 }, 10*time.Second, 5*time.Millisecond, "connections after the upgrade")
	failed := dials.Stop()
	t.Logf("%d connections opened across the upgrade, %d failed", dials.Runs(), len(failed))
	assert.Empty(t, failed, "connections that failed")
	talk(t, conn, "after")
	assert.NotContains(t, tp.Node.Exec(t, "nft", "list", "table", "inet", "kproxy"), "svc4-", "a chain of the previous layout survived")
}
