//go:build privileged || vm

package nftables_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// checkFlow explains a flow from outside to dst and asks the proxier for
// the kernel's word on it.
func checkFlow(t *testing.T, p *nftables.Proxier, st *servicelb.State, proto servicelb.Protocol, dst string) servicelb.KernelCheck {
	t.Helper()
	src := netip.MustParseAddrPort("198.51.100.2:40000")
	d := netip.MustParseAddrPort(dst)
	if d.Addr().Is6() {
		src = netip.MustParseAddrPort("[fd00:c::2]:40000")
	}
	ex := st.Explain(servicelb.Flow{Protocol: proto, Src: src, Dst: d})
	kc, err := p.CheckFlow(testCtx(t), &ex)
	require.NoError(t, err)
	require.Equal(t, "nftables", kc.Backend)
	return kc
}

// TestCheckFlowReadsTheKernel: the kernel's word on every frontend of a
// state is that it holds what the explanation decides, naming the
// objects it read; a rule, element or chain someone removed or put in the
// way, and an explanation of another state, are differences.
func TestCheckFlowReadsTheKernel(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nat")
	h := netnstest.NewHost(t, "checkflow")
	p := newProxier(t, h, nftables.Options{NoConntrackCleanup: true})
	st := richState(t)
	mustSync(t, p, st)

	for _, sp := range st.Ports() {
		for _, fe := range sp.Frontends() {
			kc := checkFlow(t, p, st, sp.Port.Protocol, fe.AddrPort().String())
			assert.Empty(t, kc.Differences, "%s %s", sp.Key, fe)
			assert.NotEmpty(t, kc.Read, "%s %s", sp.Key, fe)
		}
	}
	kc := checkFlow(t, p, st, servicelb.TCP, "10.96.0.10:80")
	read := strings.Join(kc.Read, "\n")
	assert.Regexp(t, `set verdicts4/[a-z/-]+: 10.96.0.10 . tcp . 80\n`, read, "the frontend in the set of its shape")
	assert.Contains(t, read, "set buckets4/cluster-2: 10.96.0.10 . tcp . 80")
	assert.Contains(t, read, "chain cluster4: ")
	assert.Regexp(t, `map endpoints4: 10.96.0.10 . tcp . 80 . [01] : 10.244.1.2 . 8080`, read, "the endpoint's bucket")
	assert.Contains(t, read, "set cluster-ips4: 10.96.0.10")
	// An unallocated service address, a port no endpoint serves: the
	// node's rules alone, and no element of the services map in the way.
	assert.Empty(t, checkFlow(t, p, st, servicelb.TCP, "10.96.0.99:80").Differences)
	assert.Empty(t, checkFlow(t, p, st, servicelb.UDP, "10.96.0.12:99").Differences)

	t.Run("an element in the way", func(t *testing.T) {
		h.Exec(t, "nft", "add", "element", "inet", nftables.DefaultTable, "services4", "{ 10.96.0.99 . tcp . 80 : drop }")
		kc := checkFlow(t, p, st, servicelb.TCP, "10.96.0.99:80")
		require.Len(t, kc.Differences, 1, kc.Differences)
		assert.Contains(t, kc.Differences[0], "map services4: element 10.96.0.99 . tcp . 80 : drop is not the proxier's")
		assert.Empty(t, checkFlow(t, p, st, servicelb.TCP, "10.96.0.10:80").Differences, "another frontend's flow")
	})
	t.Run("an element changed", func(t *testing.T) {
		h.Exec(t, "nft", "delete", "element", "inet", nftables.DefaultTable, "services4", "{ 10.96.0.11 . tcp . 80 }")
		h.Exec(t, "nft", "add", "element", "inet", nftables.DefaultTable, "services4", "{ 10.96.0.11 . tcp . 80 : goto cluster4 }")
		kc := checkFlow(t, p, st, servicelb.TCP, "10.96.0.11:80")
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "10.96.0.11 . tcp . 80 : goto cluster4 is not the proxier's")
	})
	t.Run("an element missing", func(t *testing.T) {
		h.Exec(t, "nft", "delete", "element", "inet", nftables.DefaultTable, "buckets4/cluster-2", "{ 10.96.0.10 . tcp . 80 }")
		kc := checkFlow(t, p, st, servicelb.TCP, "10.96.0.10:80")
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "set buckets4/cluster-2: element 10.96.0.10 . tcp . 80 is missing")
	})
	t.Run("a chain flushed", func(t *testing.T) {
		h.Exec(t, "nft", "flush", "chain", "inet", nftables.DefaultTable, "cluster4")
		kc := checkFlow(t, p, st, servicelb.TCP, "10.96.0.10:80")
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "chain cluster4: 0 rules, the plan has")
	})
	t.Run("an explanation of another state", func(t *testing.T) {
		ed := st.Edit()
		web, ok := st.Service("default/web")
		require.True(t, ok)
		svc := *web
		svc.Endpoints = append(slices.Clone(web.Endpoints), servicelb.Endpoint{Addr: netnstest.BackendIPv4(2)})
		require.NoError(t, ed.Upsert(svc))
		kc := checkFlow(t, p, ed.State(), servicelb.TCP, "10.96.0.10:80")
		assert.Contains(t, strings.Join(kc.Differences, "\n"), "the explanation is of another state than the one applied")
	})
	t.Run("closed", func(t *testing.T) {
		require.NoError(t, p.Close())
		ex := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("198.51.100.2:1"), Dst: netip.MustParseAddrPort("10.96.0.10:80")})
		_, err := p.CheckFlow(testCtx(t), &ex)
		require.ErrorIs(t, err, servicelb.ErrClosed)
	})
}
