//go:build linux

package userspace

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// FuzzPlans walks states drawn from the fuzzer's bytes and plans each as
// a sync and Render do: Render refuses only services (or a node the proxy
// cannot serve) and lists every service port it takes; each frontend of a
// port gets one listen address, taken by no other frontend, a listener
// unless every flow to it is refused, and held unless it is the node's;
// and each set of endpoints picks every endpoint once before it has none
// left.
func FuzzPlans(f *testing.F) {
	for _, seed := range []string{"", "userspace", "\x00\x01\x02\x03\x04\x05\x06\x07\x08", "a longer seed that steers more of the walk"} {
		f.Add([]byte(seed))
	}
	p, err := New(Options{HoldAddresses: true})
	require.NoError(f, err)
	f.Cleanup(func() { _ = p.Close() })
	caps := p.Capabilities()
	f.Fuzz(func(t *testing.T, data []byte) {
		g := servicetest.New(servicetest.Options{Source: servicetest.Source(data), Schedulers: caps.Schedulers})
		walk, err := g.Walk(30)
		require.NoError(t, err)
		for i, st := range walk {
			planState(t, p, st, i)
		}
	})
}

// planState checks the plan of one state (see FuzzPlans).
func planState(t *testing.T, p *Proxier, st *servicelb.State, step int) {
	t.Helper()
	caps, node := p.Capabilities(), st.Node()
	text, renderErr := p.Render(st)
	if caps.CheckNode(&node) != nil {
		require.Error(t, renderErr, "step %d: Render of a node the proxy refuses", step)
		return
	}
	if renderErr != nil {
		require.NotNil(t, servicelb.ServicesOf(renderErr), "step %d: Render failed, and not for services: %v", step, renderErr)
	}
	again, _ := p.Render(st)
	require.Equal(t, text, again, "step %d: Render differs from itself", step)
	pl := newPlanner(&p.o, node, nil)
	taken := map[listenKey]servicelb.ServicePortKey{}
	for _, sp := range st.Ports() {
		if caps.CheckPort(sp) != nil {
			continue
		}
		fs, err := pl.fronts(sp)
		require.NoError(t, err, "step %d: %s", step, sp.Key)
		require.Len(t, fs, len(sp.Frontends()), "step %d: %s", step, sp.Key)
		for _, f := range fs {
			other, clash := taken[f.key]
			require.False(t, clash, "step %d: %s and %s listen at %v", step, sp.Key, other, f.key)
			taken[f.key] = sp.Key
			v, uniform := sp.Verdicts(f.kind).Uniform()
			require.Equal(t, !uniform || v.Action != servicelb.Reject, f.listen, "step %d: %s at %v", step, sp.Key, f.key)
			a := f.key.at.Addr()
			require.Equal(t, !a.IsLoopback() && !pl.nodeAddrs[a], f.hold, "step %d: %s at %v", step, sp.Key, f.key)
		}
		if renderErr == nil {
			require.Contains(t, text, fmt.Sprintf("\nport %s %s\n", sp.Key, sp.Port.Protocol.Lower()), "step %d", step)
		}
		for _, bs := range [][]servicelb.Backend{sp.Cluster, sp.Local} {
			pickAll(t, newTargets(bs, sp.Scheduler), len(bs), step)
		}
	}
}

// pickAll picks from t until it has nothing left: each of its n endpoints
// once.
func pickAll(t *testing.T, tg *targets, n, step int) {
	t.Helper()
	var tr tried
	for range n {
		i := tg.pick(tr)
		require.True(t, i >= 0 && i < n && !tr.has(i), "step %d: picked %d after %v of %d", step, i, tr, n)
		tr = append(tr, i)
	}
	require.Equal(t, -1, tg.pick(tr), "step %d: a pick after every endpoint was tried", step)
}
