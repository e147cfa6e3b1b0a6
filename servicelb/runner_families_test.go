package servicelb_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// dualSvc is a dual-stack service with an endpoint of each family.
func dualSvc(name string, last byte) servicelb.Service {
	return servicelb.Service{
		Name:       name,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 1, last}), netip.MustParseAddr(fmt.Sprintf("fd00:96::1:%d", last))},
		Ports:      []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.AddrFrom4([4]byte{10, 244, 1, last})},
			{Addr: netip.MustParseAddr(fmt.Sprintf("fd00:244::1:%d", last))},
		},
	}
}

// familyTimes returns, by family, the times a result holds.
func familyTimes(res servicelb.SyncResult) map[servicelb.Family][]time.Time {
	out := map[servicelb.Family][]time.Time{}
	for _, f := range res.Families {
		out[f.Family] = f.Triggered
	}
	return out
}

// familyQueued returns, by family, when the oldest change waiting was
// made, and the latest.
func familyQueued(h servicelb.Health) (oldest, latest map[servicelb.Family]time.Time) {
	oldest, latest = map[servicelb.Family]time.Time{}, map[servicelb.Family]time.Time{}
	for _, f := range h.Families {
		oldest[f.Family], latest[f.Family] = f.QueuedAt, f.LastQueuedAt
	}
	return oldest, latest
}

// TestRunnerFamilies: every sync is reported in each family the proxier
// programs, and each change in the families it touched, as kube-proxy's
// proxier of each family takes it: endpoints of a family touch that
// family, any other change every family the service is served in, a
// node change both. What waits, and since when, is told per family too.
func TestRunnerFamilies(t *testing.T) {
	v4, v6 := servicelb.IPv4, servicelb.IPv6
	h, src := newHarness(t, "s")
	h.idle()
	src[0].Synced()
	h.idle()
	res := h.lastResult()
	assert.Equal(t, []servicelb.FamilySync{{Family: v4}, {Family: v6}}, res.Families, "a first sync of nothing")
	oldest, latest := familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: {}, v6: {}}, oldest)
	assert.Equal(t, map[servicelb.Family]time.Time{v4: {}, v6: {}}, latest)

	t.Log("a dual-stack service and an IPv4 one")
	// Each step's changes come within MinSyncInterval of the last sync,
	// so that they wait for the next one together.
	step := func() time.Time {
		h.clk.Advance(100 * time.Millisecond)
		return h.clk.Now()
	}
	sync := func() servicelb.SyncResult {
		h.clk.Advance(minI)
		h.idle()
		return h.lastResult()
	}
	dualAt := step()
	cause := dualAt.Add(-3 * time.Second)
	require.NoError(t, src[0].UpsertTriggered(cause, dualSvc("d", 5)))
	h.idle()
	arrived := step()
	require.NoError(t, src[0].Upsert(svc("a", 1)))
	h.idle()
	oldest, latest = familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: dualAt, v6: dualAt}, oldest)
	assert.Equal(t, map[servicelb.Family]time.Time{v4: arrived, v6: dualAt}, latest)
	res = sync()
	require.NoError(t, res.Err)
	assert.Equal(t, []time.Time{cause, arrived}, res.Triggered)
	assert.Equal(t, map[servicelb.Family][]time.Time{v4: {cause, arrived}, v6: {cause}}, familyTimes(res))
	oldest, latest = familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: {}, v6: {}}, oldest, "applied")
	assert.Equal(t, map[servicelb.Family]time.Time{v4: arrived, v6: dualAt}, latest, "the latest stay")

	t.Log("an IPv6 endpoint of the dual-stack service changes: IPv6 alone, kept across a failed sync")
	d := dualSvc("d", 5)
	d.Endpoints[1].Ready = new(false)
	ipv6Change := step()
	require.NoError(t, src[0].Upsert(d))
	h.idle()
	oldest, _ = familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: {}, v6: ipv6Change}, oldest)
	h.p.FailNext(errors.New("boom"))
	res = sync()
	require.Error(t, res.Err)
	assert.Equal(t, []servicelb.FamilySync{{Family: v4}, {Family: v6}}, res.Families, "a failed sync reports no change")
	oldest, _ = familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: {}, v6: ipv6Change}, oldest, "still waiting after the failure")
	for _, f := range h.r.Health().Families {
		assert.Equal(t, f.Family == v6, f.Stalled(ipv6Change.Add(time.Minute), time.Minute), f.Family)
	}
	h.clk.Advance(retry)
	h.idle()
	res = h.lastResult()
	require.NoError(t, res.Err)
	assert.Equal(t, map[servicelb.Family][]time.Time{v4: nil, v6: {ipv6Change}}, familyTimes(res))

	t.Log("an IPv6 endpoint on the IPv4 service: the IPv6 endpoints changed; its port: IPv4, where it is served")
	a := svc("a", 1)
	a.Endpoints = append(a.Endpoints, servicelb.Endpoint{Addr: netip.MustParseAddr("fd00:244::9")})
	endpoint6 := step()
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	port := step()
	a.Ports[0].Port = 81
	require.NoError(t, src[0].Upsert(a))
	h.idle()
	assert.Equal(t, map[servicelb.Family][]time.Time{v4: {port}, v6: {endpoint6}}, familyTimes(sync()))

	t.Log("the dual-stack service deleted: both; the node changed: both wait, with no cause to report")
	deleted := step()
	require.NoError(t, src[0].Delete("d"))
	h.idle()
	assert.Equal(t, map[servicelb.Family][]time.Time{v4: {deleted}, v6: {deleted}}, familyTimes(sync()))
	nodeChange := step()
	require.NoError(t, h.r.SetNode(servicelb.NodeConfig{NodeName: "n2"}))
	h.idle()
	oldest, latest = familyQueued(h.r.Health())
	assert.Equal(t, map[servicelb.Family]time.Time{v4: nodeChange, v6: nodeChange}, oldest)
	assert.Equal(t, map[servicelb.Family]time.Time{v4: nodeChange, v6: nodeChange}, latest)
	assert.Equal(t, map[servicelb.Family][]time.Time{v4: nil, v6: nil}, familyTimes(sync()))
}

// TestRunnerFamiliesOfTheProxier: a proxier that programs one family is
// reported in that family alone.
func TestRunnerFamiliesOfTheProxier(t *testing.T) {
	caps := fake.AllCapabilities()
	caps.Families = []servicelb.Family{servicelb.IPv6}
	p := &fake.Proxier{Caps: caps}
	results := make(chan servicelb.SyncResult, 1)
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{Hooks: servicelb.Hooks{Synced: func(res servicelb.SyncResult) { results <- res }}})
	require.NoError(t, err)
	src := r.Source("s")
	require.NoError(t, src.Upsert(dualSvc("d", 5)))
	require.Len(t, r.Health().Families, 1)
	assert.Equal(t, servicelb.IPv6, r.Health().Families[0].Family)
	assert.False(t, r.Health().Families[0].QueuedAt.IsZero())
	ctx := t.Context()
	go func() { _ = r.Run(ctx) }()
	src.Synced()
	select {
	case res := <-results:
		require.Len(t, res.Families, 1)
		assert.Equal(t, servicelb.IPv6, res.Families[0].Family)
		assert.Len(t, res.Families[0].Triggered, 1)
	case <-time.After(10 * time.Second):
		t.Fatal("no sync")
	}
}
