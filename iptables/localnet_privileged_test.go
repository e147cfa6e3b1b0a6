//go:build privileged

package iptables

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/sysctl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestRouteLocalnet: net.ipv4.conf.all.route_localnet, which lets the
// kernel route a flow from 127.0.0.1 once it is translated to an endpoint
// elsewhere, stays 0 in the proxier's namespace while the node serves no
// node ports on localhost, and becomes 1 with LocalhostNodePorts (as
// kube-proxy's iptables mode sets it); turning them off leaves it 1, for
// others may need it. An IPv6-only proxier, which serves no IPv4 node
// port on localhost, leaves it alone, and so does one whose node-port
// addresses leave the loopback network out (kube-proxy turns its
// localhostNodePorts off then).
func TestRouteLocalnet(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat")
	const name = "net.ipv4.conf.all.route_localnet"
	svc := servicelb.Service{
		Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, NodePort: 30080}},
		Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2")}},
	}
	for _, tc := range []struct {
		name      string
		families  []servicelb.Family
		addresses []netip.Prefix
		want      string // with localhost node ports
	}{
		{"both families", nil, nil, "1"},
		{"IPv6 alone", []servicelb.Family{servicelb.IPv6}, nil, "0"},
		{"node-port addresses without loopback", nil, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, "0"},
		{"node-port addresses with loopback", nil, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("127.0.0.0/8")}, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := netnstest.NewHost(t, "localnet")
			// A new namespace takes its IPv4 settings from the initial
			// one: start from 0 whatever the host has.
			_, err := sysctl.Apply(h.NS, []sysctl.Setting{{Name: name, Value: "0"}})
			require.NoError(t, err)
			localnet := func() string {
				v, err := sysctl.Get(h.NS, name)
				require.NoError(t, err)
				return v
			}
			px := newProxier(t, h, Options{Families: tc.families})
			node := servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")},
				NodePortAddresses: tc.addresses}
			sync := func(localhost bool) {
				t.Helper()
				node.LocalhostNodePorts = localhost
				st, err := servicelb.NewState(node, svc)
				require.NoError(t, err)
				require.NoError(t, servicetest.SyncErr(px.Sync(context.Background(), st)))
			}

			sync(false)
			assert.Equal(t, "0", localnet(), "without localhost node ports")
			sync(false)
			assert.Equal(t, "0", localnet(), "without localhost node ports, again")
			sync(true)
			assert.Equal(t, tc.want, localnet(), "with localhost node ports")
			assert.Equal(t, tc.want+"\n", h.Exec(t, "cat", "/proc/sys/net/ipv4/conf/all/route_localnet"), "as the kernel shows it")
			sync(false)
			assert.Equal(t, tc.want, localnet(), "localhost node ports turned off: left as it is")
		})
	}
}
