package syncer

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestPendingFlows: a pending filter follows the changes of its frontend
// until it is deleted, and goes when no endpoint serves its frontend; a
// full rewrite covers every frontend of the state that endpoints serve.
func TestPendingFlows(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.244.1.2:53"), netip.MustParseAddrPort("10.244.2.2:53")
	vip := netip.MustParseAddr("10.96.0.10")
	port := func(serving ...netip.AddrPort) *servicelb.ServicePort {
		sp := &servicelb.ServicePort{Key: servicelb.ServicePortKey{Service: "d/s", Family: servicelb.IPv4},
			Port: servicelb.Port{Protocol: servicelb.UDP, Port: 53}, ClusterIP: vip}
		for _, a := range serving {
			sp.Cluster = append(sp.Cluster, servicelb.Backend{Addr: a.Addr(), Port: a.Port(), Weight: 1, Ready: true})
		}
		return sp
	}
	var pf pendingFlows
	pf.refresh(&servicelb.Changes{Changed: []servicelb.PortChange{{Old: port(a, b), New: port(a)}}})
	require.True(t, pf.empty(), "refresh adds nothing")
	pf.add([]servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{a}}})
	// b serves again: a retry must keep its flows.
	pf.refresh(&servicelb.Changes{Changed: []servicelb.PortChange{{Old: port(a), New: port(a, b)}}})
	assert.Equal(t, []servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{a, b}}}, pf.list())
	pf.refresh(&servicelb.Changes{Changed: []servicelb.PortChange{{Old: port(a, b), New: port()}}})
	assert.Empty(t, pf.list(), "a frontend that no endpoint serves deletes no flow")
	pf.add([]servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{a}}})
	pf.refresh(&servicelb.Changes{Removed: []*servicelb.ServicePort{port(a, b)}})
	assert.Empty(t, pf.list(), "a frontend gone deletes no flow")

	st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{Name: "d/t", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.11")},
		Ports: []servicelb.Port{{Protocol: servicelb.UDP, Port: 53}}, Endpoints: []servicelb.Endpoint{{Addr: b.Addr()}}})
	require.NoError(t, err)
	pf.add([]servicelb.StaleFlow{{Protocol: servicelb.UDP, Dst: vip, Port: 53, Serving: []netip.AddrPort{a}}})
	pf.reset(st)
	assert.Equal(t, st.StaleFlows(), pf.list(), "a frontend the state lacks deletes no flow")
	pf.clear()
	assert.True(t, pf.empty())
}
