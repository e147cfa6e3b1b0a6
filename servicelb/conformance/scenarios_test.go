//go:build linux

package conformance

import (
	"net/netip"
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
