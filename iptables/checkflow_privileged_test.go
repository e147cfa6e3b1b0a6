//go:build privileged || vm

package iptables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestCheckFlowReadsTheKernel: the kernel's word on every frontend of a
// state is that it holds what the explanation decides, naming the chains
// it read; a chain someone flushed, and an explanation of another state,
// are differences.
func TestCheckFlowReadsTheKernel(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "checkflow")
	px := newProxier(t, h, Options{NoConntrackCleanup: true})
	st := richState(t)
	require.NoError(t, servicetest.SyncErr(px.Sync(t.Context(), st)))
	check := func(st *servicelb.State, p servicelb.Protocol, dst netip.AddrPort) servicelb.KernelCheck {
		t.Helper()
		src := netip.MustParseAddrPort("198.51.100.200:40000")
		if dst.Addr().Is6() {
			src = netip.MustParseAddrPort("[2001:db8:ffff::200]:40000")
		}
		ex := st.Explain(servicelb.Flow{Protocol: p, Src: src, Dst: dst})
		kc, err := px.CheckFlow(t.Context(), &ex)
		require.NoError(t, err)
		require.Equal(t, "iptables", kc.Backend)
		return kc
	}
	for _, sp := range st.Ports() {
		for _, fe := range sp.Frontends() {
			kc := check(st, sp.Port.Protocol, fe.AddrPort())
			assert.Empty(t, kc.Differences, "%s %s", sp.Key, fe)
			assert.NotEmpty(t, kc.Read, "%s %s", sp.Key, fe)
		}
	}
	i := slices.IndexFunc(st.Ports(), func(sp *servicelb.ServicePort) bool {
		return sp.Family == servicelb.IPv4 && sp.ClusterIP.IsValid() && len(sp.Cluster) > 0 && sp.Affinity == 0 &&
			sp.Internal.Of(servicelb.FromOutside).Action == servicelb.ToCluster
	})
	require.GreaterOrEqual(t, i, 0, "a port that forwards to its cluster's endpoints")
	sp := st.Ports()[i]
	dst := netip.AddrPortFrom(sp.ClusterIP, sp.Port.Port)
	svc := px.n.svc(sp)
	kc := check(st, sp.Port.Protocol, dst)
	assert.Contains(t, strings.Join(kc.Read, "\n"), "ip nat chain "+svc+": ")

	t.Run("an explanation of another state", func(t *testing.T) {
		old, ok := st.Service(sp.Key.Service)
		require.True(t, ok)
		s := *old
		s.Endpoints = append(slices.Clone(old.Endpoints), servicelb.Endpoint{Addr: netip.MustParseAddr("10.244.9.9")})
		ed := st.Edit()
		require.NoError(t, ed.Upsert(s))
		kc := check(ed.State(), sp.Port.Protocol, dst)
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "the explanation is of another state than the one applied")
	})
	t.Run("a foreign rule in the dispatch chain", func(t *testing.T) {
		services := px.n.fixed(chainServices)
		h.Exec(t, "iptables-nft", "-t", "nat", "-I", services, "1", "-d", "10.96.0.99/32", "-j", "RETURN")
		kc := check(st, sp.Port.Protocol, dst)
		assert.Contains(t, kc.Differences, "ip nat chain "+services+": rule 1 is not the owner's: a foreign rule, or one of a key changed")
		h.Exec(t, "iptables-nft", "-t", "nat", "-D", services, "1")
		assert.Empty(t, check(st, sp.Port.Protocol, dst).Differences)
	})
	t.Run("a chain flushed", func(t *testing.T) {
		h.Exec(t, "iptables-nft", "-t", "nat", "-F", svc)
		kc := check(st, sp.Port.Protocol, dst)
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "ip nat chain "+svc+": rule 1 is missing")
	})
}
