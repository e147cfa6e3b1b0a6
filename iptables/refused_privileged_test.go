//go:build privileged || vm

package iptables

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// manyServices returns n services, each with a cluster IP of 10.96.0.0/16
// and one endpoint of 10.1.0.0/16 of its own.
func manyServices(n int) []servicelb.Service {
	out := make([]servicelb.Service, n)
	for i := range out {
		out[i] = servicelb.Service{
			Name:       fmt.Sprintf("default/svc-%04d", i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints:  []servicelb.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(i%250 + 1)})}},
		}
	}
	return out
}

// TestKernelRefusalLeavesOnePortOut: the kernel refuses what the Proxier
// writes for one service (its rules, made to name a chain that does not
// exist): that service is left out, named alone in the report, and
// the 1,000 others are in the kernel after the same Sync, as Render shows
// them. Changed and refused again in a change (which the kernel's ENOENT
// makes a whole write, refused too), it stays out while a good service's
// change in the same sync goes in; a later change of another service
// reaches the kernel in the next sync; once the refused service changes
// and the kernel takes it, it goes in.
func TestKernelRefusalLeavesOnePortOut(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	h := netnstest.NewHost(t, "iptrefused")
	px := newProxier(t, h, Options{NoConntrackCleanup: true})
	b, err := servicelb.NewBuilder(richNode())
	require.NoError(t, err)
	good := manyServices(1000)
	for _, s := range good {
		require.NoError(t, b.Upsert(s))
	}
	withoutBad := b.State()
	bad := servicelb.Service{
		Name: "default/bad", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.9")}},
	}
	require.NoError(t, b.Upsert(bad))
	ctx := context.Background()
	batches := 0
	conn := px.conn.(*nfnl.Conn)
	conn.RefuseRules(func(o any) bool {
		k, ok := o.(servicelb.ServicePortKey)
		return ok && k.Service == bad.Name
	})
	refuse := nfnl.WithTap(ctx, func([]byte) { batches++ })
	leftOut := func(rep servicelb.SyncReport, err error) []string {
		t.Helper()
		require.NoError(t, err)
		return slices.Sorted(maps.Keys(rep.LeftOut))
	}

	rep, err := px.Sync(refuse, b.State())
	assert.Equal(t, []string{bad.Name}, leftOut(rep, err))
	err = servicetest.LeftOut(rep)
	require.ErrorIs(t, err, servicelb.ErrRefused)
	require.ErrorIs(t, err, syscall.ENOENT)
	assert.Contains(t, err.Error(), `service "default/bad": ports default/bad:http/ipv4: refused by the kernel`)
	checkRendered(t, h, px, withoutBad, "the 1,000 good services after the refusal")

	bad.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.8")}}
	require.NoError(t, b.Upsert(bad))
	moved := good[3]
	moved.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.3.0.3")}}
	require.NoError(t, b.Upsert(moved))
	batches = 0
	assert.Equal(t, []string{bad.Name}, leftOut(px.Sync(refuse, b.State())))
	assert.Equal(t, 3, batches, "the change, the whole write, the whole write without the refused service")
	v4 := saved(t, h, servicelb.IPv4)
	assert.Contains(t, v4, "--to-destination 10.3.0.3:8080")
	assert.NotContains(t, v4, "10.96.9.9")

	moved = good[7]
	moved.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.3.0.7")}}
	require.NoError(t, b.Upsert(moved))
	batches = 0
	assert.Equal(t, []string{bad.Name}, leftOut(px.Sync(refuse, b.State())))
	assert.Equal(t, 1, batches)
	v4 = saved(t, h, servicelb.IPv4)
	assert.Contains(t, v4, "--to-destination 10.3.0.7:8080")
	assert.NotContains(t, v4, "--to-destination 10.1.0.8:8080")

	bad.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.10")}}
	require.NoError(t, b.Upsert(bad))
	conn.RefuseRules(nil)
	require.NoError(t, servicetest.SyncErr(px.Sync(ctx, b.State())))
	checkRendered(t, h, px, b.State(), "after the refused service changed")
}
