//go:build vm

package ipvs

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestColdSyncBatches: a cold sync sends its virtual servers, real
// servers and addresses many to a system call, not one each.
func TestColdSyncBatches(t *testing.T) {
	e := newEnv(t, 1, Options{})
	svcs := make([]servicelb.Service, 300)
	for i := range svcs {
		svcs[i] = benchService(i, 0)
	}
	st := e.state(svcs...)
	ipvs0, rt0 := e.p.k.ipvs.Stats(), e.p.k.rt.Stats()
	e.sync(st)
	ipvs, rt := e.p.k.ipvs.Stats(), e.p.k.rt.Stats()
	sent, calls := ipvs.Messages-ipvs0.Messages, ipvs.Datagrams-ipvs0.Datagrams
	assert.GreaterOrEqual(t, sent, 300+3000, "IPVS requests")
	assert.LessOrEqual(t, calls*100, sent, "IPVS: %d requests in %d system calls, want 100 or more to a call", sent, calls)
	// Route netlink also carries a few requests of one each (the link's
	// lookup, address dumps, the wait for IPv6 addresses to be routed),
	// so its bound is a count of calls: one address each would be 300.
	sent, calls = rt.Messages-rt0.Messages, rt.Datagrams-rt0.Datagrams
	assert.GreaterOrEqual(t, sent, 300, "address requests")
	assert.LessOrEqual(t, calls, 20, "addresses: %d requests in %d system calls, want them batched", sent, calls)
	e.checkIPVS(st)
}

// TestFailedAddSendsNoRemoval: IPVS is not transactional, and the
// requests of a batch are all handled whatever became of the others; a
// sync whose additions fail in part sends none of its removals, so that
// no virtual server loses a real server while another one's replacement
// is missing, and the next sync converges.
func TestFailedAddSendsNoRemoval(t *testing.T) {
	e := newEnv(t, 1, Options{})
	first, second := benchService(0, 0), benchService(1, 0) // 10.96.0.1 and .2, in that order
	e.sync(e.state(first, second))
	// Someone deletes the second virtual server; the proxier learns it
	// only at its next deep check or failure.
	e.tp.Node.Exec(t, "ipvsadm", "-D", "-t", "10.96.0.2:80")
	first.Endpoints[9].Addr = a("100.127.255.1")
	second.Endpoints[9].Addr = a("100.127.255.2")
	next := e.state(first, second)
	err := servicetest.SyncErr(e.p.Sync(t.Context(), next))
	require.ErrorIs(t, err, ErrKernel)
	require.ErrorIs(t, err, unix.ESRCH)
	require.ErrorContains(t, err, "add real server -t 10.96.0.2:80")
	save := e.tp.Node.Exec(t, "ipvsadm", "-Sn")
	assert.Contains(t, save, "-a -t 10.96.0.1:80 -r 100.127.255.1:8080", "the first server's addition")
	assert.Contains(t, save, "-a -t 10.96.0.1:80 -r "+benchEndpoint(0, 9).String()+":8080",
		"the real server it replaces stays while the second's addition failed")
	e.sync(next)
	e.checkIPVS(next)
}

// TestCleanupBatches: Cleanup deletes the virtual servers in one batch.
func TestCleanupBatches(t *testing.T) {
	e := newEnv(t, 1, Options{})
	svcs := make([]servicelb.Service, 200)
	for i := range svcs {
		svcs[i] = benchService(i, 0)
	}
	e.sync(e.state(svcs...))
	before := e.p.k.ipvs.Stats()
	require.NoError(t, e.p.Cleanup(t.Context()))
	after := e.p.k.ipvs.Stats()
	assert.GreaterOrEqual(t, after.Messages-before.Messages, 200)
	assert.LessOrEqual(t, after.Datagrams-before.Datagrams, 5)
	assert.Empty(t, strings.TrimSpace(e.tp.Node.Exec(t, "ipvsadm", "-Sn")))
}
