//go:build vm

package ipvs

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestKernelRefusalLeavesOneServiceOut: IPVS refuses a real server whose
// address is a broadcast address of the node (the last address of its
// link to backend 0): that service alone is left out (servicelb.ErrRefused,
// wrapping the kernel's EINVAL), and the 1,000 others are applied in the
// same Sync, as Render shows them, the virtual server made before the
// refusal removed. A later change of a good service reaches the kernel in
// the next sync; once the refused service changes to an endpoint the
// kernel takes, it goes in.
func TestKernelRefusalLeavesOneServiceOut(t *testing.T) {
	e := newEnv(t, 1, Options{})
	b, err := servicelb.NewBuilder(e.node)
	require.NoError(t, err)
	endpoint := func(a string) []servicelb.Endpoint {
		return []servicelb.Endpoint{{Addr: netip.MustParseAddr(a), NodeName: "node"}}
	}
	good := make([]servicelb.Service, 1000)
	for i := range good {
		good[i] = servicelb.Service{
			Name:       fmt.Sprintf("default/svc-%04d", i),
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i / 250), byte(i%250 + 1)})},
			Ports:      []servicelb.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
			Endpoints:  endpoint(backendAddr(0, servicelb.IPv4).String()),
		}
		require.NoError(t, b.Upsert(good[i]))
	}
	bad := servicelb.Service{
		Name: "default/bad", ClusterIPs: []netip.Addr{a("10.96.9.9")},
		Ports:     []servicelb.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080}},
		Endpoints: endpoint("10.244.1.255"),
	}
	require.NoError(t, b.Upsert(bad))

	rep, err := e.p.Sync(t.Context(), b.State())
	assert.Equal(t, []string{bad.Name}, leftOut(t, rep, err, servicelb.ErrRefused))
	err = servicetest.LeftOut(rep)
	require.ErrorIs(t, err, syscall.EINVAL)
	assert.Contains(t, err.Error(), `service "default/bad": ports default/bad:http/ipv4: refused by the kernel: add real server`)
	rest := rep.Applied
	if diff := gocmp.Diff(renderText(t, rest, e.p.opts), kernelText(t, e.tp.Node, e.p.opts)); diff != "" {
		t.Fatalf("the kernel is not the 1,000 good services' (-render +kernel):\n%s", diff)
	}

	moved := good[7]
	moved.Endpoints = endpoint("10.244.1.3")
	require.NoError(t, b.Upsert(moved))
	rep, err = e.p.Sync(t.Context(), b.State())
	assert.Equal(t, []string{bad.Name}, leftOut(t, rep, err, servicelb.ErrRefused))
	got := e.tp.Node.Exec(t, "ipvsadm", "-Sn")
	assert.Contains(t, got, "-a -t 10.97.0.8:80 -r 10.244.1.3:8080")
	assert.False(t, strings.Contains(got, "10.96.9.9"), "the refused service's virtual server is in the kernel")

	bad.Endpoints = endpoint("10.244.1.4")
	require.NoError(t, b.Upsert(bad))
	e.sync(b.State())
	e.checkIPVS(b.State())
}
