package servicelb_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// TestCapabilityErrorsAgree renders, without a kernel, a service with a
// scheduler hint each backend refuses: every backend refuses it with the
// same typed error naming the same service and field, and the same
// message but for the backend's name and hints.
func TestCapabilityErrorsAgree(t *testing.T) {
	nft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer nft.Close()
	ipt, err := iptables.New(iptables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer ipt.Close()
	var ipvsProxier *ipvs.Proxier // its capabilities need no kernel
	render := map[string]func(*servicelb.State) (string, error){
		"nftables": nft.Render,
		"iptables": ipt.Render,
		"ipvs":     func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) },
	}
	caps := map[string]servicelb.Capabilities{
		"nftables": nft.Capabilities(), "iptables": ipt.Capabilities(), "ipvs": ipvsProxier.Capabilities(),
	}
	var texts []string
	for name, r := range render {
		c := caps[name]
		var hint servicelb.Scheduler
		for _, s := range servicelb.Schedulers() {
			if !c.AcceptsScheduler(s) {
				hint = s
				break
			}
		}
		require.NotEmpty(t, hint, "%s honours every hint", name)
		st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{
			Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}}, Scheduler: hint,
		})
		require.NoError(t, err)
		_, err = r(st)
		require.ErrorIs(t, err, servicelb.ErrUnsupported, name)
		var ve *servicelb.ValidationError
		require.True(t, errors.As(err, &ve), name)
		assert.Equal(t, "ns/web", ve.Service, name)
		assert.Equal(t, "scheduler", ve.Field, name)
		text := strings.Replace(strings.Replace(err.Error(), name, "B", 1), string(hint), "H", 1)
		texts = append(texts, text[:strings.Index(text, "honours")])
	}
	for _, x := range texts[1:] {
		assert.Equal(t, texts[0], x, "the backends' errors differ")
	}
}

// TestNodeRefusalsAgree: a node the backend cannot serve (node ports on
// localhost) is refused by Render with the same typed error on the
// backends without the feature, and rendered by the one with it.
func TestNodeRefusalsAgree(t *testing.T) {
	nft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer nft.Close()
	ipt, err := iptables.New(iptables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer ipt.Close()
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, LocalhostNodePorts: true},
		servicelb.Service{Name: "ns/web", Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, NodePort: 30080}}})
	require.NoError(t, err)
	for name, r := range map[string]func(*servicelb.State) (string, error){
		"nftables": nft.Render,
		"ipvs":     func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) },
	} {
		_, err := r(st)
		require.ErrorIs(t, err, servicelb.ErrUnsupported, name)
		var ve *servicelb.ValidationError
		require.ErrorAs(t, err, &ve, name)
		assert.Equal(t, "localhostNodePorts", ve.Field, name)
	}
	text, err := ipt.Render(st)
	require.NoError(t, err)
	assert.Contains(t, text, "-A KPROXY-SERVICES -d 127.0.0.1/32")
	assert.Contains(t, text, `-A KPROXY-LOCALNET-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`)
}

// TestBackendsRenderEveryDetection: every backend declares the detection
// of pods by interface and renders a node in each local-traffic
// detection mode.
func TestBackendsRenderEveryDetection(t *testing.T) {
	nft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer nft.Close()
	ipt, err := iptables.New(iptables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	defer ipt.Close()
	var ipvsProxier *ipvs.Proxier
	us, err := userspace.New(userspace.Options{})
	require.NoError(t, err)
	defer us.Close()
	backends := map[string]struct {
		caps   servicelb.Capabilities
		render func(*servicelb.State) (string, error)
	}{
		"nftables":  {nft.Capabilities(), nft.Render},
		"iptables":  {ipt.Capabilities(), ipt.Render},
		"ipvs":      {ipvsProxier.Capabilities(), func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) }},
		"userspace": {us.Capabilities(), us.Render},
	}
	pfx := netip.MustParsePrefix
	for name, b := range backends {
		assert.True(t, b.caps.Features.Has(servicelb.FeatureLocalByInterface), name)
		for _, d := range []servicelb.DetectLocal{
			{},
			{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:244:1::/64")}},
			{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"},
			{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
		} {
			node := servicelb.NodeConfig{NodeName: "n", ClusterCIDRs: []netip.Prefix{pfx("10.244.0.0/16")}, DetectLocal: d}
			st, err := servicelb.NewState(node, servicelb.Service{
				Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
				ExternalTrafficPolicy: servicelb.PolicyLocal, ExternalIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
				Ports:     []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
				Endpoints: []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.2.2"), NodeName: "other"}},
			})
			require.NoError(t, err)
			_, err = b.render(st)
			assert.NoError(t, err, "%s, %s", name, d.Mode)
			assert.NoError(t, b.caps.CheckNode(&node), "%s, %s", name, d.Mode)
		}
	}
}
