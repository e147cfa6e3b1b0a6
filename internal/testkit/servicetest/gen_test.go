package servicetest

import (
	"cmp"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// TestWalkCoversTheServicePort: a walk of a few hundred states reaches
// every shape the property tests need: each verdict, both families and
// every protocol, source ranges, affinity, health check ports, schedulers,
// clashes, node changes, node ports on some of the node's addresses, on
// its other local addresses and on localhost, load-balancer IPs in Proxy
// mode, every local-traffic detection, nested service CIDRs, endpoints
// listed twice, hairpin and serving endpoints.
func TestWalkCoversTheServicePort(t *testing.T) {
	states, err := New(Options{Seed: 1, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}, LocalhostNodePorts: true}).Walk(400)
	require.NoError(t, err)
	require.Len(t, states, 400)
	seen := map[string]bool{}
	for i, st := range states {
		if len(st.Conflicts()) > 0 {
			seen["conflict"] = true
		}
		if i > 0 {
			if c := servicelb.Diff(states[i-1], st); c.NodeChanged {
				seen["node change"] = true
			}
		}
		node := st.Node()
		seen["detect "+string(node.LocalMode())] = true
		if len(node.ServiceCIDRs) > len(node.DroppedServiceCIDRs(servicelb.IPv4))+len(node.DroppedServiceCIDRs(servicelb.IPv6)) {
			seen["nested service CIDRs"] = true
		}
		if node.NodePortPrimary {
			seen["primary"] = true
		}
		for _, s := range st.Services() {
			if len(s.ProxiedLoadBalancerIPs) > 0 {
				seen["proxied load-balancer IPs"] = true
			}
			addrs := map[netip.Addr]bool{}
			for _, e := range s.Endpoints {
				if addrs[e.Addr] {
					seen["endpoint listed twice"] = true
				}
				addrs[e.Addr] = true
			}
		}
		for _, sp := range st.Ports() {
			seePort(seen, &node, sp)
		}
	}
	for _, want := range []string{"conflict", "node change", "ipv4", "ipv6", "tcp", "udp", "sctp", "reject", "drop",
		"cluster", "cluster+masq", "local", "local+masq", "ranges", "affinity", "health", "scheduler", "node port",
		"node port on some node addresses", "node port on another local address", "node port on localhost", "primary",
		"proxied load-balancer IPs", "nested service CIDRs", "endpoint listed twice", "hairpin", "serving not selected",
		"detect ClusterCIDR", "detect NodeCIDR", "detect BridgeInterface", "detect InterfaceNamePrefix"} {
		assert.True(t, seen[want], "no %s in the walk", want)
	}
}

// seePort notes the shapes of one service port.
func seePort(seen map[string]bool, node *servicelb.NodeConfig, sp *servicelb.ServicePort) {
	seen[sp.Family.String()] = true
	seen[sp.Port.Protocol.Lower()] = true
	for _, vs := range []servicelb.Verdicts{sp.Internal, sp.External} {
		for _, o := range servicelb.Origins() {
			seen[vs.Of(o).String()] = true
		}
	}
	for what, ok := range map[string]bool{
		"ranges":                             len(sp.SourceRanges) > 0,
		"affinity":                           sp.Affinity > 0,
		"health":                             sp.HealthCheckNodePort > 0,
		"scheduler":                          sp.Scheduler != "",
		"node port":                          len(sp.NodeIPs) > 0,
		"node port on some node addresses":   len(sp.NodeIPs) > 0 && len(sp.NodeIPs) < len(node.IPs(sp.Family))+len(node.LocalIPs),
		"node port on another local address": slices.ContainsFunc(sp.NodeIPs, func(a netip.Addr) bool { return slices.Contains(node.LocalIPs, a) }),
		"node port on localhost":             slices.Contains(sp.NodeIPs, netip.AddrFrom4([4]byte{127, 0, 0, 1})),
		"hairpin":                            len(slices.Collect(sp.HairpinAddrs())) > 0,
		"serving not selected":               len(sp.ServingEndpoints()) > len(slices.Collect(sp.HairpinAddrs())),
	} {
		seen[what] = seen[what] || ok
	}
}

// TestSource: the same data gives the same numbers, the data's own bytes
// first; once they run out the numbers go on varying (a rejection
// sampler such as IntN(3) must end).
func TestSource(t *testing.T) {
	data := []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 3}
	a, b := Source(data), Source(data)
	require.Equal(t, uint64(1), a.Uint64())
	require.Equal(t, uint64(1), b.Uint64())
	require.Equal(t, uint64(0x0302), a.Uint64())
	require.Equal(t, uint64(0x0302), b.Uint64())
	seen := map[uint64]bool{}
	for range 16 {
		x := a.Uint64()
		require.Equal(t, x, b.Uint64())
		seen[x] = true
	}
	require.Greater(t, len(seen), 8, "numbers after the data do not vary")
	r := rand.New(Source(nil))
	for range 100 {
		r.IntN(3)
	}
}

// TestServingIsEveryServingEndpoint: over a walk of states, a port's
// ServingEndpoints (read from its sets and the few it keeps beside them),
// and the deprecated list Serving, are every
// endpoint of its service and family that is ready or serving, at its
// target port, whatever the selection; Serves finds each of them, and no
// other.
func TestServingIsEveryServingEndpoint(t *testing.T) {
	states, err := New(Options{Seed: 2, Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom}}).Walk(200)
	require.NoError(t, err)
	for _, st := range states {
		svcs := map[string]*servicelb.Service{}
		for _, s := range st.Services() {
			svcs[s.Name] = s
		}
		for _, sp := range st.Ports() {
			var want []netip.AddrPort
			for _, e := range svcs[sp.Key.Service].Endpoints {
				if servicelb.FamilyOf(e.Addr) != sp.Family || !e.IsReady() && !e.IsServing() {
					continue
				}
				port, ok := e.Ports[sp.Port.Name]
				if !ok && e.OnlyNamedPorts {
					continue
				}
				if !ok {
					port = cmp.Or(sp.Port.TargetPort, sp.Port.Port)
				}
				want = append(want, netip.AddrPortFrom(e.Addr, port))
			}
			slices.SortFunc(want, netip.AddrPort.Compare)
			want = slices.Compact(want)
			require.Equal(t, want, sp.ServingEndpoints(), "%s", sp.Key)
			//lint:ignore SA1019 the deprecated list holds the same until it goes
			require.Equal(t, want, sp.Serving, "%s: the deprecated list", sp.Key)
			//lint:ignore SA1019 the deprecated list holds the same until it goes
			require.Equal(t, slices.Collect(sp.HairpinAddrs()), sp.Hairpin, "%s: the deprecated list", sp.Key)
			for _, a := range want {
				require.True(t, sp.Serves(a), "%s: %s", sp.Key, a)
				other := netip.AddrPortFrom(a.Addr(), a.Port()+1)
				require.Equal(t, slices.Contains(want, other), sp.Serves(other), "%s: %s", sp.Key, other)
			}
		}
	}
}
