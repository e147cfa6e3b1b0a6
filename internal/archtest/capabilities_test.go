package archtest

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// renderer is a backend that renders a State without a kernel, and the
// capabilities it declares.
type renderer struct {
	caps   servicelb.Capabilities
	render func(*servicelb.State) (string, error)
}

// renderers returns every backend's rendering path, none of which needs
// privileges: nftables, iptables, ipvs, userspace, and the ebpf socket
// hooks alone and paired with nftables.
func renderers(t *testing.T) map[string]renderer {
	t.Helper()
	nft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	t.Cleanup(func() { nft.Close() })
	ipt, err := iptables.New(iptables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	t.Cleanup(func() { ipt.Close() })
	ipvsProxier := new(ipvs.Proxier) // its capabilities need no kernel
	us, err := userspace.New(userspace.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { us.Close() })
	sockets, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup/kproxy-render"})
	require.NoError(t, err)
	pairNft, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	require.NoError(t, err)
	pair, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup/kproxy-render", Packets: pairNft})
	require.NoError(t, err)
	t.Cleanup(func() { pairNft.Close() })
	return map[string]renderer{
		"nftables":      {nft.Capabilities(), nft.Render},
		"iptables":      {ipt.Capabilities(), ipt.Render},
		"ipvs":          {ipvsProxier.Capabilities(), func(st *servicelb.State) (string, error) { return ipvs.Render(st, ipvs.Options{}) }},
		"userspace":     {us.Capabilities(), us.Render},
		"ebpf":          {sockets.Capabilities(), sockets.Render},
		"ebpf+nftables": {pair.Capabilities(), pair.Render},
	}
}

// refusal is a kind of service a backend may refuse: want returns one the
// capabilities c refuse, or false when they accept every service of the
// kind.
type refusal struct {
	name  string
	kind  error
	field string
	want  func(c *servicelb.Capabilities) (servicelb.Service, bool)
}

func refusals() []refusal {
	svc := func() servicelb.Service {
		return servicelb.Service{
			Name: "ns/web", ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
			Ports:           []servicelb.Port{{Name: "p", Protocol: servicelb.TCP, Port: 80}},
			Endpoints:       []servicelb.Endpoint{{Addr: netip.MustParseAddr("10.244.1.2")}},
		}
	}
	return []refusal{
		{"scheduler", servicelb.ErrUnsupported, "scheduler", func(c *servicelb.Capabilities) (servicelb.Service, bool) {
			s := svc()
			for _, h := range servicelb.Schedulers() {
				if !c.AcceptsScheduler(h) {
					s.Scheduler = h
					return s, true
				}
			}
			return s, false
		}},
		{"protocol", servicelb.ErrUnsupported, `ports["p"].protocol`, func(c *servicelb.Capabilities) (servicelb.Service, bool) {
			s := svc()
			for _, p := range []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP} {
				if !c.AcceptsProtocol(p) {
					s.Ports[0].Protocol = p
					return s, true
				}
			}
			return s, false
		}},
		{"capacity", servicelb.ErrCapacity, "endpoints", func(c *servicelb.Capabilities) (servicelb.Service, bool) {
			s := svc()
			if c.MaxEndpoints == 0 {
				return s, false
			}
			s.Endpoints = nil
			for i := range c.MaxEndpoints + 1 {
				s.Endpoints = append(s.Endpoints, servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)})})
			}
			return s, true
		}},
		{"source ranges", servicelb.ErrUnsupported, "sourceRanges", func(c *servicelb.Capabilities) (servicelb.Service, bool) {
			s := svc()
			s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
			return s, !c.Features.Has(servicelb.FeatureSourceRanges)
		}},
		{"affinity", servicelb.ErrUnsupported, "affinity", func(c *servicelb.Capabilities) (servicelb.Service, bool) {
			s := svc()
			s.Affinity = servicelb.SessionAffinity{ClientIP: true}
			return s, !c.Features.Has(servicelb.FeatureAffinity)
		}},
	}
}

// TestCapabilityErrorsAgree renders, without a kernel, a service of each
// kind a backend may refuse (a scheduler hint, a protocol, more endpoints
// than a port may have, a feature) on every backend. A backend whose
// capabilities refuse it fails with servicelb's own error (the same text
// as Capabilities.CheckPort's), a typed error naming the service and the
// field, so that the backends that refuse one kind say the same but for
// their names and limits; a backend whose capabilities accept it renders
// it, refusing nothing its capabilities do not.
func TestCapabilityErrorsAgree(t *testing.T) {
	rs := renderers(t)
	for _, k := range refusals() {
		t.Run(k.name, func(t *testing.T) {
			texts := map[string]string{}
			for name, r := range rs {
				s, refused := k.want(&r.caps)
				st, err := servicelb.NewState(servicelb.NodeConfig{}, s)
				require.NoError(t, err)
				_, err = r.render(st)
				if !refused {
					assert.NoError(t, err, "%s: accepts it, yet does not render it", name)
					continue
				}
				require.ErrorIs(t, err, k.kind, name)
				var ve *servicelb.ValidationError
				require.ErrorAs(t, err, &ve, name)
				assert.Equal(t, "ns/web", ve.Service, name)
				assert.Equal(t, k.field, ve.Field, name)
				want := r.caps.CheckPort(st.Ports()[0])
				require.Error(t, want, name)
				assert.Equal(t, want.Error(), err.Error(), "%s: not servicelb's error", name)
				texts[name] = normalize(err.Error(), name, &r.caps)
			}
			if k.name == "scheduler" {
				assert.Len(t, texts, len(rs), "every backend refuses some scheduler hint")
			}
			var first string
			for name, x := range texts {
				if first == "" {
					first = name
					continue
				}
				assert.Equal(t, texts[first], x, "%s and %s say it differently", first, name)
			}
		})
	}
}

// normalize replaces in a refusal what differs between backends by right:
// the backend's name, its limit on endpoints and its list of schedulers
// and protocols.
func normalize(text, backend string, c *servicelb.Capabilities) string {
	text = strings.ReplaceAll(text, "the "+backend+" backend", "the B backend")
	if i := strings.Index(text, "honours"); i >= 0 {
		text = text[:i] + "honours <schedulers>"
	}
	if i := strings.Index(text, "carries"); i >= 0 {
		text = text[:i] + "carries <protocols>"
	}
	for _, h := range servicelb.Schedulers() {
		text = strings.ReplaceAll(text, fmt.Sprintf("%q", h), "<hint>")
	}
	for _, p := range []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP} {
		text = strings.ReplaceAll(text, string(p), "<protocol>")
	}
	if m := c.MaxEndpoints; m > 0 {
		text = strings.ReplaceAll(text, strconv.Itoa(m+1), "<n>")
		text = strings.ReplaceAll(text, strconv.Itoa(m), "<max>")
	}
	return text
}

// TestNodeRefusalsAgree: a node a backend cannot serve (node ports on
// localhost, pods told by interface) is refused by Render with
// servicelb's own error on every backend without the feature, and
// rendered by those with it.
func TestNodeRefusalsAgree(t *testing.T) {
	rs := renderers(t)
	for _, k := range []struct {
		feature servicelb.Features
		field   string
		node    servicelb.NodeConfig
	}{
		{servicelb.FeatureLocalhostNodePorts, "localhostNodePorts",
			servicelb.NodeConfig{NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, LocalhostNodePorts: true}},
		{servicelb.FeatureLocalByInterface, "detectLocal.mode",
			servicelb.NodeConfig{DetectLocal: servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: "cbr0"}}},
	} {
		st, err := servicelb.NewState(k.node,
			servicelb.Service{Name: "ns/web", Ports: []servicelb.Port{{Protocol: servicelb.TCP, Port: 80, NodePort: 30080}}})
		require.NoError(t, err)
		for name, r := range rs {
			text, err := r.render(st)
			if r.caps.Features.Has(k.feature) {
				assert.NoError(t, err, "%s declares %s", name, k.feature)
				if name == "iptables" && k.feature == servicelb.FeatureLocalhostNodePorts {
					assert.Contains(t, text, "-A KPROXY-SERVICES -d 127.0.0.1/32")
					assert.Contains(t, text, `-A KPROXY-LOCALNET-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`)
				}
				continue
			}
			require.ErrorIs(t, err, servicelb.ErrUnsupported, name)
			var ve *servicelb.ValidationError
			require.ErrorAs(t, err, &ve, name)
			assert.Equal(t, k.field, ve.Field, name)
			n := st.Node()
			assert.Equal(t, r.caps.CheckNode(&n).Error(), err.Error(), "%s: not servicelb's error", name)
		}
	}
}

// TestBackendsRenderEveryDetection: every backend declares the detection
// of pods by interface and renders a node in each local-traffic
// detection mode.
func TestBackendsRenderEveryDetection(t *testing.T) {
	backends := renderers(t)
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
