//go:build vm

package ipvs

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestCheckFlowReadsTheKernel: the kernel's word on every frontend of a
// state is that IPVS holds what the explanation decides, naming the
// virtual and real servers it read; a real server someone removed or
// added, and a virtual server in the way of a flow the state does not
// serve, are differences.
func TestCheckFlowReadsTheKernel(t *testing.T) {
	e := newEnv(t, 2, Options{})
	st := e.state(servicelb.Service{
		Name: "default/web", ClusterIPs: []netip.Addr{a("10.96.0.50")}, ExternalIPs: []netip.Addr{a("203.0.113.50")},
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30050, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{{Addr: backendAddr(0, servicelb.IPv4)}, {Addr: backendAddr(1, servicelb.IPv4)}},
	})
	e.sync(st)
	check := func(dst string) servicelb.KernelCheck {
		t.Helper()
		ex := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("198.51.100.2:40000"), Dst: netip.MustParseAddrPort(dst)})
		kc, err := e.p.CheckFlow(t.Context(), &ex)
		require.NoError(t, err)
		require.Equal(t, "ipvs", kc.Backend)
		return kc
	}
	for _, sp := range st.Ports() {
		for _, fe := range sp.Frontends() {
			kc := check(fe.AddrPort().String())
			assert.Empty(t, kc.Differences, "%s %s", sp.Key, fe)
		}
	}
	kc := check("10.96.0.50:80")
	read := strings.Join(kc.Read, "\n")
	assert.Contains(t, read, "virtual server -t 10.96.0.50:80 ")
	assert.Contains(t, read, "-> 10.244.1.2:8080 weight ")
	assert.Contains(t, read, "link "+DefaultInterface+": 10.96.0.50")
	assert.Equal(t, []string{"no virtual server -t 10.96.0.99:80"}, check("10.96.0.99:80").Read)

	e.tp.Node.Exec(t, "ipvsadm", "-d", "-t", "10.96.0.50:80", "-r", "10.244.1.2:8080")
	e.tp.Node.Exec(t, "ipvsadm", "-a", "-t", "10.96.0.50:80", "-r", "10.244.9.9:8080", "-m", "-w", "1")
	differ := strings.Join(check("10.96.0.50:80").Differences, "\n")
	assert.Contains(t, differ, "virtual server -t 10.96.0.50:80: real server 10.244.1.2:8080 is missing")
	assert.Contains(t, differ, "virtual server -t 10.96.0.50:80: real server 10.244.9.9:8080 (weight 1) is not the plan's")

	e.tp.Node.Exec(t, "ipvsadm", "-A", "-t", "10.96.0.99:80")
	assert.Equal(t, []string{"virtual server -t 10.96.0.99:80 exists: it takes a flow no frontend of the state serves"},
		check("10.96.0.99:80").Differences)
}
