//go:build privileged || vm

package nftables_test

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/nftables"
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
// exist; its elements, made unreadable): that service is left out, named alone in the report, and
// the 1,000 others are in the kernel after the same Sync. A later change
// of another service reaches the kernel in the next sync; once the
// refused service changes and the kernel takes it, it goes in.
func TestKernelRefusalLeavesOnePortOut(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h, fresh := netnstest.NewHost(t, "refused"), netnstest.NewHost(t, "fresh")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true, Logger: testLogger(t)})
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netnstest.NodeIPv4()}, ClusterCIDRs: netnstest.ClusterCIDRs()}
	b, err := servicelb.NewBuilder(node)
	require.NoError(t, err)
	good := manyServices(1000)
	for _, s := range good {
		require.NoError(t, b.Upsert(s))
	}
	// Its port has affinity, so that it has rules of its own.
	bad := servicelb.Service{
		Name: "default/bad", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.9")}},
		Affinity:  servicelb.SessionAffinity{ClientIP: true, Timeout: time.Minute},
	}
	require.NoError(t, b.Upsert(bad))
	nftables.RefuseRules(p, func(o any) bool {
		k, ok := o.(servicelb.ServicePortKey)
		return ok && k.Service == bad.Name
	})
	refuse := testCtx(t)

	rep, err := p.Sync(refuse, b.State())
	require.NoError(t, err)
	assert.Equal(t, []string{bad.Name}, slices.Sorted(maps.Keys(rep.LeftOut)))
	err = servicetest.LeftOut(rep)
	require.ErrorIs(t, err, servicelb.ErrRefused)
	require.ErrorIs(t, err, syscall.ENOENT)
	assert.Contains(t, err.Error(), `service "default/bad": ports default/bad:http/ipv4: refused by the kernel`)

	// The table holds the 1,000, as a fresh apply of them does.
	withoutBad := mustState(t, node, good...)
	text, err := p.Render(withoutBad)
	require.NoError(t, err)
	fresh.ExecInput(t, text, "nft", "-f", "-")
	if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
		t.Fatalf("the table is not the 1,000 good services' (-want +got):\n%s", diff)
	}
	listed := h.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable)
	assert.NotContains(t, listed, "10.96.9.9")

	// The refused service changes, and the kernel refuses it again, in a
	// change of the table (which it takes for drift: the whole table is
	// written, refused too), together with an endpoint change of a good
	// service: it stays out, and the good change goes in, in the same
	// Sync. Three batches: the change, the whole table, the change
	// without the refused service.
	bad.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.8")}}
	require.NoError(t, b.Upsert(bad))
	moved := good[3]
	moved.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.3.0.3")}}
	require.NoError(t, b.Upsert(moved))
	batches := 0
	rep, err = p.Sync(nfnl.WithTap(refuse, func([]byte) { batches++ }), b.State())
	require.NoError(t, err)
	assert.Len(t, rep.LeftOut, 1)
	assert.Contains(t, rep.LeftOut, bad.Name)
	assert.Equal(t, 3, batches)
	listed = h.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable)
	assert.Contains(t, listed, "10.3.0.3 . 8080")
	assert.NotContains(t, listed, "10.96.9.9")

	// An endpoint change of a good service reaches the kernel in the
	// next sync; the refused service, unchanged, is not tried again.
	moved = good[7]
	moved.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.3.0.7")}}
	require.NoError(t, b.Upsert(moved))
	batches = 0
	rep, err = p.Sync(nfnl.WithTap(refuse, func([]byte) { batches++ }), b.State())
	require.NoError(t, err)
	assert.Len(t, rep.LeftOut, 1)
	assert.Equal(t, 1, batches)
	listed = h.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable)
	assert.Contains(t, listed, "10.3.0.7 . 8080")
	assert.NotContains(t, listed, good[7].Endpoints[0].Addr.String()+" . 8080")

	// The refused service changes, and the kernel takes it: it goes in.
	bad.Endpoints = []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.10")}}
	require.NoError(t, b.Upsert(bad))
	nftables.RefuseRules(p, nil)
	require.NoError(t, servicetest.SyncErr(p.Sync(testCtx(t), b.State())))
	listed = h.Exec(t, "nft", "list", "table", "inet", nftables.DefaultTable)
	assert.Contains(t, listed, "10.96.9.9 . tcp . 80")
	t.Run("elements", refusedElements)
	assert.True(t, strings.Contains(listed, "10.2.9.10"), "the changed service's endpoint is not in the table")
}

// refusedElements: the kernel refuses the elements the Proxier writes for
// a port without affinity (its only objects), made unreadable: the port
// is left out, named alone, and the others are in the kernel after the
// same Sync.
func refusedElements(t *testing.T) {
	h, fresh := netnstest.NewHost(t, "refused-elems"), netnstest.NewHost(t, "fresh-elems")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	node := servicelb.NodeConfig{NodeName: "node", NodeIPs: []netip.Addr{netnstest.NodeIPv4()}, ClusterCIDRs: netnstest.ClusterCIDRs()}
	good := manyServices(100)
	bad := servicelb.Service{
		Name: "default/bad", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.9.9")},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.2.9.9")}},
	}
	nftables.RefuseRules(p, func(o any) bool {
		k, ok := o.(servicelb.ServicePortKey)
		return ok && k.Service == bad.Name
	})
	mustSync(t, p, mustState(t, node, good...))
	batches := 0
	rep, err := p.Sync(nfnl.WithTap(testCtx(t), func([]byte) { batches++ }), mustState(t, node, append(slices.Clone(good), bad)...))
	require.NoError(t, err)
	assert.Equal(t, []string{bad.Name}, slices.Sorted(maps.Keys(rep.LeftOut)))
	err = servicetest.LeftOut(rep)
	require.ErrorIs(t, err, servicelb.ErrRefused)
	require.ErrorIs(t, err, syscall.EINVAL)
	// One batch: the change, which the kernel refuses. It held the
	// refused port alone, so nothing is left to apply without it: no
	// second batch, and no rewrite of the table.
	assert.Equal(t, 1, batches, "batches sent")
	mustSync(t, newProxier(t, fresh, nftables.Options{NoConntrackCleanup: true}), mustState(t, node, good...))
	if diff := cmp.Diff(fresh.CanonicalTable(t, "inet", nftables.DefaultTable), h.CanonicalTable(t, "inet", nftables.DefaultTable)); diff != "" {
		t.Fatalf("the table is not the good services' (-want +got):\n%s", diff)
	}
}
