//go:build linux

package conformance

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// TestScenarioTable checks the table without a kernel: every scenario is
// named once and says what it follows, every stage's state is valid, and
// no two scenarios share an address or node port, so that no flow of one
// meets the state of another.
func TestScenarioTable(t *testing.T) {
	caps := fake.AllCapabilities()
	caps.Schedulers, caps.MaxEndpoints = []servicelb.Scheduler{servicelb.SchedulerMaglev}, 10
	l := &lab{o: Options{Protocols: []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP}}.withDefaults(),
		p: &fake.Proxier{Caps: caps}}
	scs := Scenarios()
	assert.GreaterOrEqual(t, len(scs), 60, "scenarios")
	names := map[string]bool{}
	owner := map[netip.AddrPort]string{}
	for i, sc := range scs {
		require.False(t, names[sc.Name], "scenario %q twice", sc.Name)
		names[sc.Name] = true
		assert.NotEmpty(t, sc.Follows, "%s: follows nothing", sc.Name)
		require.NotEmpty(t, sc.Stages, sc.Name)
		e := &Env{idx: i + 1, lab: l}
		for j, st := range sc.Stages {
			e.node = baseNode()
			if st.Node != nil {
				st.Node(&e.node, e)
			}
			state, err := servicelb.NewState(e.node, st.Services(e)...)
			require.NoError(t, err, "%s: stage %d", sc.Name, j)
			for _, sp := range state.Ports() {
				for _, f := range sp.Frontends() {
					if f.Kind == servicelb.NodePortFrontend {
						f.Addr = netip.Addr{}
					}
					if o, ok := owner[f.AddrPort()]; ok && o != sc.Name {
						t.Errorf("%s and %s share %s", o, sc.Name, f.AddrPort())
					}
					owner[f.AddrPort()] = sc.Name
				}
			}
			for _, c := range st.Expect {
				assert.True(t, c.Custom != nil || c.Want.kind != reach || len(c.Want.backends) > 0, "%s: a reach check with no endpoint", sc.Name)
			}
		}
	}
}

// TestAdaptations: a backend without FeaturePreserveSource or
// FeaturePacketVerdicts has the checks those features describe read
// otherwise, and says so; one with every feature reads them as written.
func TestAdaptations(t *testing.T) {
	all := fake.AllCapabilities()
	assert.Empty(t, adaptations(&all))
	l := &lab{caps: all}
	for _, p := range []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP} {
		assert.False(t, l.resets(p), p)
	}

	proxy := all
	proxy.Features &^= servicelb.FeaturePreserveSource | servicelb.FeaturePacketVerdicts
	lines := adaptations(&proxy)
	require.Len(t, lines, 2)
	assert.Contains(t, lines[0], "preserve-source")
	assert.Contains(t, lines[1], "packet-verdicts")
	l = &lab{caps: proxy}
	assert.True(t, l.resets(servicelb.TCP))
	assert.True(t, l.resets(servicelb.SCTP))
	assert.False(t, l.resets(servicelb.UDP), "UDP is rejected and dropped alike")
}

// TestNotApplicableChecked: the scenarios a backend's capabilities or the
// run's protocols leave out must be the ones it expects; a scenario newly
// left out, one that now applies and a name that is no scenario's each
// fail the run, and scenarios Options.Run does not select do not count.
func TestNotApplicableChecked(t *testing.T) {
	scs := Scenarios()
	all := func(*Scenario) bool { return true }
	caps := fake.AllCapabilities()
	caps.Features &^= servicelb.FeatureWeights
	left := leftOut(scs, &caps, []servicelb.Protocol{servicelb.TCP, servicelb.UDP}, all)
	want := []string{"cluster-ip/weights", "left-out/endpoint-capacity", "left-out/one-bad-among-a-thousand", "left-out/unsupported-scheduler"}
	assert.ElementsMatch(t, want, slices.Collect(maps.Keys(left)))
	assert.Equal(t, "needs weights, which the backend lacks", left["cluster-ip/weights"])
	require.NoError(t, checkLeftOut(scs, want, left, all))

	err := checkLeftOut(scs, want[1:], left, all)
	require.Error(t, err, "a scenario newly left out")
	assert.Contains(t, err.Error(), "cluster-ip/weights is not applicable (needs weights, which the backend lacks), and Options.NotApplicable does not list it")
	err = checkLeftOut(scs, append(slices.Clone(want), "cluster-ip/even-shares"), left, all)
	require.Error(t, err, "a scenario listed that applies")
	assert.Contains(t, err.Error(), "cluster-ip/even-shares applies, and Options.NotApplicable lists it")
	err = checkLeftOut(scs, append(slices.Clone(want), "cluster-ip/no-such"), left, all)
	require.Error(t, err, "a name that is no scenario's")
	assert.Contains(t, err.Error(), `"cluster-ip/no-such", which is no scenario`)

	clusterIP := func(sc *Scenario) bool { return strings.HasPrefix(sc.Name, "cluster-ip/") }
	left = leftOut(scs, &caps, []servicelb.Protocol{servicelb.TCP, servicelb.UDP}, clusterIP)
	assert.Equal(t, []string{"cluster-ip/weights"}, slices.Collect(maps.Keys(left)))
	require.NoError(t, checkLeftOut(scs, want, left, clusterIP), "the unselected scenarios the list names do not count")
}

// TestProtocolsLeaveStagesEmpty: in a run over SCTP alone, a scenario
// with a stage whose checks are all of other protocols is not applicable,
// so that it cannot pass with nothing checked; the scenarios with a check
// over every protocol apply.
func TestProtocolsLeaveStagesEmpty(t *testing.T) {
	caps := fake.AllCapabilities()
	caps.Schedulers = []servicelb.Scheduler{servicelb.SchedulerMaglev}
	caps.MaxEndpoints = 10
	left := leftOut(Scenarios(), &caps, []servicelb.Protocol{servicelb.SCTP}, func(*Scenario) bool { return true })
	assert.Equal(t, "stage 0 has no check over [SCTP]", left["cluster-ip/even-shares"])
	assert.Equal(t, "stage 0 has no check over [SCTP]", left["stale-flows/endpoint-removed"])
	assert.NotContains(t, left, "cluster-ip/spread-and-masquerade")
	assert.NotContains(t, left, "cluster-ip/endpoint-changes", "a stage without checks by design is no stage left empty")
	for name, why := range left {
		assert.Contains(t, why, "no check over [SCTP]", name)
	}
	assert.ElementsMatch(t, NoSCTPChecks(), slices.Collect(maps.Keys(left)), "NoSCTPChecks")
	assert.Empty(t, leftOut(Scenarios(), &caps, []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP},
		func(*Scenario) bool { return true }))
}

// TestAskPorts checks the source ports of UDP and SCTP asks: each host
// and protocol takes the range in turn, so that no port comes back before
// askPortCount asks, and the range lies above the kernel's ephemeral
// ports, which no socket the kernel binds by itself can hold.
func TestAskPorts(t *testing.T) {
	var ap askPorts
	seen := map[uint16]bool{}
	for range askPortCount {
		p := ap.next("client", servicelb.UDP)
		require.False(t, seen[p], "port %d came back before the range was used up", p)
		require.GreaterOrEqual(t, int(p), askPortFirst)
		seen[p] = true
	}
	assert.Equal(t, uint16(askPortFirst), ap.next("client", servicelb.UDP), "after the whole range, its first port again")
	assert.Equal(t, uint16(askPortFirst), ap.next("client", servicelb.SCTP), "each protocol has its own turn")
	assert.Equal(t, uint16(askPortFirst), ap.next("node", servicelb.UDP), "each host has its own turn")

	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	require.NoError(t, err)
	var low, high int
	_, err = fmt.Sscan(string(b), &low, &high)
	require.NoError(t, err)
	assert.Greater(t, askPortFirst, high, "the range must lie above the ephemeral ports %d-%d", low, high)
}
