//go:build linux

package ebpf

import (
	"flag"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files")

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := "testdata/" + name
	if *updateGolden {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, string(want), got)
}

func renderState(t *testing.T) *servicelb.State {
	a := netip.MustParseAddr
	local := func(addr string, w uint16) servicelb.Endpoint {
		return servicelb.Endpoint{Addr: a(addr), NodeName: "node-a", Weight: servicelb.Weight(w)}
	}
	remote := func(addr string) servicelb.Endpoint {
		return servicelb.Endpoint{Addr: a(addr), NodeName: "node-b"}
	}
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "node-a", NodeIPs: []netip.Addr{a("192.0.2.1"), a("2001:db8::1")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")}},
		servicelb.Service{
			Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.10"), a("fd00:96::10")},
			ExternalIPs: []netip.Addr{a("203.0.113.10")}, LoadBalancerIPs: []netip.Addr{a("203.0.113.20")},
			SourceRanges:          []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			Affinity:              servicelb.SessionAffinity{ClientIP: true, Timeout: 30 * time.Second},
			Ports: []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080, TargetPort: 8080},
				{Name: "sctp", Protocol: servicelb.SCTP, Port: 90}},
			Endpoints: []servicelb.Endpoint{local("10.244.1.2", 1), local("10.244.1.3", 3), remote("10.244.2.2"),
				{Addr: a("fd00:244:1::2"), NodeName: "node-a"}},
		},
		servicelb.Service{
			Name: "default/dns", ClusterIPs: []netip.Addr{a("10.96.0.53")}, InternalTrafficPolicy: servicelb.PolicyLocal,
			Ports:     []servicelb.Port{{Name: "dns", Protocol: servicelb.UDP, Port: 53}},
			Endpoints: []servicelb.Endpoint{remote("10.244.2.53")},
		},
		servicelb.Service{
			Name: "default/empty", ClusterIPs: []netip.Addr{a("10.96.0.99")},
			Ports: []servicelb.Port{{Name: "tcp", Protocol: servicelb.TCP, Port: 80}},
		})
	require.NoError(t, err)
	return st
}

// TestRender renders a state with every kind of frontend, the two
// policies, affinity, weights, source ranges, a port without endpoints,
// one without a local endpoint and an SCTP port (left to the packet
// path).
func TestRender(t *testing.T) {
	p, err := ForRendering(Options{Cgroup: "/cg", Packets: packetPath{}})
	require.NoError(t, err)
	text, err := p.Render(renderState(t))
	require.NoError(t, err)
	checkGolden(t, "render.golden", text)
	again, err := Render(renderState(t), Options{Cgroup: "/cg", Packets: packetPath{}})
	require.NoError(t, err)
	assert.Equal(t, text, again, "the package's Render and a Proxier's differ")
}

// TestRenderRefuses: alone, a service with source ranges or an SCTP port
// is refused with servicelb.ErrUnsupported; the zero State with
// servicelb.ErrNoState.
func TestRenderRefuses(t *testing.T) {
	p, err := ForRendering(Options{Cgroup: "/cg"})
	require.NoError(t, err)
	_, err = p.Render(renderState(t))
	assert.ErrorIs(t, err, servicelb.ErrUnsupported)
	var ve *servicelb.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, "default/web", ve.Service)
	_, err = p.Render(&servicelb.State{})
	assert.ErrorIs(t, err, servicelb.ErrNoState)
}

func TestOptions(t *testing.T) {
	_, err := New(Options{})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	_, err = ForRendering(Options{})
	assert.ErrorIs(t, err, ErrInvalidOptions)
	p, err := ForRendering(Options{Cgroup: "/cg"})
	require.NoError(t, err)
	st, err := servicelb.NewState(servicelb.NodeConfig{})
	require.NoError(t, err)
	assert.ErrorIs(t, servicetest.SyncErr(p.Sync(t.Context(), st)), ErrRenderOnly)
	assert.ErrorIs(t, p.Cleanup(t.Context()), ErrRenderOnly)
	_, err = p.Dump(t.Context())
	assert.ErrorIs(t, err, ErrRenderOnly)
}

func TestCapabilities(t *testing.T) {
	alone := capabilities(nil)
	assert.Equal(t, "ebpf", alone.Backend)
	assert.Equal(t, []servicelb.Protocol{servicelb.TCP, servicelb.UDP}, alone.Protocols)
	assert.False(t, alone.Features.Has(servicelb.FeatureExternal))
	assert.False(t, alone.Features.Has(servicelb.FeatureSourceRanges))
	assert.True(t, alone.Features.Has(servicelb.FeatureAffinity|servicelb.FeatureWeights|servicelb.FeatureAffinityExpiry))
	pair := capabilities(packetPath{})
	assert.Equal(t, "ebpf+packets", pair.Backend)
	assert.Nil(t, pair.Protocols, "the packet path carries SCTP")
	assert.Equal(t, servicelb.AllFeatures&^servicelb.FeatureLingeringFlows, pair.Features,
		"the hooks translate each new socket afresh: a flow does not outlive its service's serving endpoints")
	assert.Equal(t, MaxEndpoints, pair.MaxEndpoints)
	assert.Equal(t, []servicelb.Scheduler{servicelb.SchedulerRandom}, pair.Schedulers)
}

// TestFormatHooks lists what the hooks wrote, as Dump does: affinity
// pins by client namespace (the node's marked) and set, with the set's
// name and idle time, and reverse translations by socket, with the
// service port whose address they show (a TCP one, a UDP one, or none
// known).
func TestFormatHooks(t *testing.T) {
	caps := capabilities(packetPath{})
	m, err := buildModel(renderState(t), &caps, nil, false) // as the hooks alone plan: refusals at the socket
	require.NoError(t, err)
	c := m.content(4097)
	const now = 100 * uint64(time.Second)
	h := &hookContent{now: now, sizes: Sizes{}.withDefaults(),
		affinity: map[affKey]affVal{
			{Cookie: 4097, Set: 1}:  {endpoint: ep("10.244.1.3:8080"), Last: now - uint64(2500*time.Millisecond)},
			{Cookie: 12289, Set: 2}: {endpoint: ep("[fd00:244:1::2]:8080"), Last: now - uint64(29*time.Second)},
			{Cookie: 12289, Set: 1}: {endpoint: ep("10.244.2.2:8080"), Last: now},
		},
		reverse: map[revKey]endpoint{
			{Cookie: 8193, endpoint: ep("10.244.1.2:8080")}:      ep("10.96.0.10:80"),
			{Cookie: 8200, endpoint: ep("10.244.2.53:53")}:       ep("10.96.0.53:53"),
			{Cookie: 8194, endpoint: ep("10.244.1.3:8080")}:      ep("192.0.2.1:30080"),
			{Cookie: 9000, endpoint: ep("10.244.9.9:8080")}:      ep("10.96.9.9:80"),
			{Cookie: 8193, endpoint: ep("10.244.1.3:8080")}:      ep("10.96.0.10:80"),
			{Cookie: 8300, endpoint: ep("[fd00:244:1::2]:8080")}: ep("[fd00:96::10]:80"),
		},
		flows: map[affKey]affVal{
			{Cookie: 8201, Set: 1}: {endpoint: ep("10.244.1.2:8080")},
		},
	}
	checkGolden(t, "dump.golden", formatContent(c, h, m.annotations()))
}
