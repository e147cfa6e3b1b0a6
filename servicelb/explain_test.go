package servicelb_test

import (
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func explainState(t *testing.T) *servicelb.State {
	t.Helper()
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	no := new(bool)
	yes := func() *bool { b := true; return &b }
	node := servicelb.NodeConfig{
		NodeName:     "n1",
		Zone:         "z1",
		NodeIPs:      []netip.Addr{a("192.168.0.10")},
		ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{p("10.96.0.0/16")},
	}
	st, err := servicelb.NewState(node,
		servicelb.Service{
			Name:                  "default/web",
			ClusterIPs:            []netip.Addr{a("10.96.0.10")},
			LoadBalancerIPs:       []netip.Addr{a("203.0.113.10")},
			SourceRanges:          []netip.Prefix{p("198.51.100.0/24")},
			ExternalTrafficPolicy: servicelb.PolicyLocal,
			HealthCheckNodePort:   30100,
			Ports:                 []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{
				{Addr: a("10.244.1.5"), NodeName: "n1"},
				{Addr: a("10.244.2.5"), NodeName: "n2"},
				{Addr: a("10.244.1.6"), NodeName: "n1", Ready: no, Serving: yes(), Terminating: true},
				{Addr: a("10.244.2.6"), NodeName: "n2", Weight: servicelb.Weight(0)},
				{Addr: a("10.244.2.7"), NodeName: "n2", Ready: no},
			},
		},
		servicelb.Service{
			Name:       "default/dns",
			ClusterIPs: []netip.Addr{a("10.96.0.20")},
			Ports:      []servicelb.Port{{Name: "dns", Protocol: servicelb.UDP, Port: 53}},
		},
		servicelb.Service{
			Name:            "default/closed",
			ClusterIPs:      []netip.Addr{a("10.96.0.40")},
			LoadBalancerIPs: []netip.Addr{a("203.0.113.40")},
			SourceRanges:    []netip.Prefix{p("198.51.100.0/24")},
			Ports:           []servicelb.Port{{Protocol: servicelb.TCP, Port: 80}},
		},
		servicelb.Service{
			Name:       "default/zoned",
			ClusterIPs: []netip.Addr{a("10.96.0.30")},
			Ports:      []servicelb.Port{{Protocol: servicelb.TCP, Port: 443}},
			Endpoints: []servicelb.Endpoint{
				{Addr: a("10.244.1.9"), NodeName: "n1", Hints: servicelb.Hints{ForZones: []string{"z1"}}},
				{Addr: a("10.244.3.9"), NodeName: "n3", Hints: servicelb.Hints{ForZones: []string{"z2"}}},
			},
		},
	)
	require.NoError(t, err)
	return st
}

func addrs(bs []servicelb.Backend) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.AddrPort().String())
	}
	return out
}

func whyOf(xs []servicelb.Excluded) map[string]string {
	out := map[string]string{}
	for _, x := range xs {
		out[x.Endpoint.String()] = x.Why
	}
	return out
}

func TestExplain(t *testing.T) {
	st := explainState(t)
	ap := netip.MustParseAddrPort
	outside := servicelb.FromOutside
	for _, tc := range []struct {
		name      string
		flow      servicelb.Flow
		origin    servicelb.Origin
		handled   bool
		action    servicelb.Action
		masq      bool
		endpoints []string
		excluded  map[string]string // endpoint: a word its reason holds
		why       string            // a word the reasons hold
	}{{
		name:   "a pod to a cluster IP",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:40000"), Dst: ap("10.96.0.10:80")},
		origin: servicelb.FromPod, handled: true, action: servicelb.ToCluster,
		endpoints: []string{"10.244.1.5:8080", "10.244.2.5:8080"},
		excluded: map[string]string{"10.244.1.6:8080": "terminating", "10.244.2.6:8080": "weight 0",
			"10.244.2.7:8080": "not ready"},
		why: "Cluster",
	}, {
		name:   "the node to a cluster IP, masqueraded",
		flow:   servicelb.Flow{Src: ap("192.168.0.10:40000"), Dst: ap("10.96.0.10:80")},
		origin: servicelb.FromNode, handled: true, action: servicelb.ToCluster, masq: true,
		endpoints: []string{"10.244.1.5:8080", "10.244.2.5:8080"},
	}, {
		name:   "outside to a node port of a Local policy",
		flow:   servicelb.Flow{Src: ap("198.51.100.7:5000"), Dst: ap("192.168.0.10:30080")},
		origin: servicelb.FromOutside, handled: true, action: servicelb.ToLocal,
		endpoints: []string{"10.244.1.5:8080"},
		excluded:  map[string]string{"10.244.2.5:8080": "not this node", "10.244.1.6:8080": "terminating"},
		why:       "Local",
	}, {
		name:   "a pod to a node port of a Local policy: every endpoint",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:5000"), Dst: ap("192.168.0.10:30080")},
		origin: servicelb.FromPod, handled: true, action: servicelb.ToCluster,
		endpoints: []string{"10.244.1.5:8080", "10.244.2.5:8080"},
		why:       "short-circuit",
	}, {
		name:   "a source outside the ranges of a load-balancer IP",
		flow:   servicelb.Flow{Src: ap("192.0.2.1:5000"), Dst: ap("203.0.113.10:80")},
		origin: servicelb.FromOutside, handled: true, action: servicelb.Drop,
		why: "source ranges",
	}, {
		name:   "a source outside the ranges of a port no endpoint serves: rejected all the same",
		flow:   servicelb.Flow{Src: ap("192.0.2.1:5000"), Dst: ap("203.0.113.40:80")},
		origin: servicelb.FromOutside, handled: true, action: servicelb.Reject,
		why: "rejected",
	}, {
		name:   "a source inside them",
		flow:   servicelb.Flow{Src: ap("198.51.100.9:5000"), Dst: ap("203.0.113.10:80")},
		origin: servicelb.FromOutside, handled: true, action: servicelb.ToLocal,
		endpoints: []string{"10.244.1.5:8080"},
	}, {
		name:   "an undefined port of a cluster IP",
		flow:   servicelb.Flow{Src: ap("192.168.0.10:5000"), Dst: ap("10.96.0.10:81")},
		origin: servicelb.FromNode, handled: true, action: servicelb.Reject,
		why: "no port 81/TCP",
	}, {
		name:   "an unallocated service address",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:5000"), Dst: ap("10.96.0.99:80")},
		origin: servicelb.FromPod, handled: true, action: servicelb.Drop,
		why: "unallocated",
	}, {
		name:   "a port no endpoint serves",
		flow:   servicelb.Flow{Protocol: servicelb.UDP, Src: ap("10.244.1.5:5000"), Dst: ap("10.96.0.20:53")},
		origin: servicelb.FromPod, handled: true, action: servicelb.Reject,
		why: "rejected",
	}, {
		name:   "no service's address",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:5000"), Dst: ap("8.8.8.8:53")},
		origin: servicelb.FromPod,
		why:    "no service's frontend",
	}, {
		name:   "the other protocol of a cluster IP's port",
		flow:   servicelb.Flow{Protocol: servicelb.UDP, Src: ap("10.244.1.5:5000"), Dst: ap("10.96.0.10:80")},
		origin: servicelb.FromPod, handled: true, action: servicelb.Reject,
		why: "no port 80/UDP",
	}, {
		name:   "topology hints for this node's zone",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:5000"), Dst: ap("10.96.0.30:443")},
		origin: servicelb.FromPod, handled: true, action: servicelb.ToCluster,
		endpoints: []string{"10.244.1.9:443"},
		excluded:  map[string]string{"10.244.3.9:443": "zones [z2]"},
	}, {
		name:   "an origin given",
		flow:   servicelb.Flow{Src: ap("10.244.1.5:5000"), Dst: ap("192.168.0.10:30080"), Origin: &outside},
		origin: servicelb.FromOutside, handled: true, action: servicelb.ToLocal,
		endpoints: []string{"10.244.1.5:8080"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := st.Explain(tc.flow)
			assert.Equal(t, tc.origin, e.Origin, e.OriginWhy)
			assert.Equal(t, tc.handled, e.Handled, "handled: %v", e.Why)
			assert.Equal(t, tc.action, e.Verdict.Action, "%v", e.Why)
			assert.Equal(t, tc.masq, e.Verdict.Masquerade, e.MasqueradeWhy)
			assert.Equal(t, tc.endpoints, addrs(e.Endpoints))
			got := whyOf(e.Excluded)
			for ep, word := range tc.excluded {
				assert.Contains(t, got[ep], word, "why %s is left out", ep)
			}
			if tc.why != "" {
				assert.Contains(t, strings.Join(e.Why, "; "), tc.why)
			}
		})
	}
}

// TestExplainAgreesWithPorts: over random states, for every frontend of
// every port and every origin, the explanation's verdict and endpoints
// are the port's, and every other endpoint of the family is left out
// with a reason of its own.
func TestExplainAgreesWithPorts(t *testing.T) {
	for seed := range uint64(20) {
		g := servicetest.New(servicetest.Options{Seed: seed})
		states, err := g.Walk(15)
		require.NoError(t, err)
		for _, st := range states {
			for _, sp := range st.Ports() {
				svc, ok := st.Service(sp.Key.Service)
				require.True(t, ok)
				for _, fe := range sp.Frontends() {
					for _, o := range servicelb.Origins() {
						if fe.Addr.IsLoopback() && o != servicelb.FromNode {
							continue
						}
						src := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.200"), 999)
						if sp.Family == servicelb.IPv6 {
							src = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:ffff::200"), 999)
						}
						e := st.Explain(servicelb.Flow{Protocol: sp.Port.Protocol, Src: src, Dst: fe.AddrPort(), Origin: &o})
						require.True(t, e.Handled, "%s %s from %s: %v", sp.Key, fe, o, e.Why)
						require.Same(t, sp, e.Port)
						want := sp.Verdicts(fe.Kind).Of(o)
						if !e.SourceAllowed {
							continue
						}
						require.Equal(t, want, e.Verdict, "%s %s from %s", sp.Key, fe, o)
						require.Equal(t, sp.Targets(want), e.Endpoints)
						seen := map[netip.Addr]bool{}
						for _, b := range e.Endpoints {
							seen[b.Addr] = true
						}
						for _, x := range e.Excluded {
							require.NotEqual(t, "not selected", x.Why, "%s %s from %s: %s has no reason", sp.Key, fe, o, x.Endpoint)
							seen[x.Endpoint.Addr()] = true
						}
						for _, ep := range svc.Endpoints {
							if servicelb.FamilyOf(ep.Addr) == sp.Family {
								require.True(t, seen[ep.Addr], "%s: endpoint %s neither chosen nor left out", sp.Key, ep.Addr)
							}
						}
					}
				}
			}
		}
	}
}

func TestExplainText(t *testing.T) {
	st := explainState(t)
	e := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("198.51.100.7:5000"), Dst: netip.MustParseAddrPort("192.168.0.10:30080")})
	text := e.Text()
	for _, want := range []string{
		"flow        tcp 198.51.100.7:5000 -> 192.168.0.10:30080",
		"origin      outside: ",
		"frontend    node port 192.168.0.10:30080 of default/web:http/ipv4",
		"verdict     forwarded to one of the endpoints below (this node's), source kept",
		"endpoints   10.244.1.5:8080  weight 1  local",
		"excluded    10.244.2.5:8080 on n2: on node \"n2\", not this node",
	} {
		assert.Contains(t, text, want)
	}
	miss := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("10.244.1.5:5000"), Dst: netip.MustParseAddrPort("8.8.8.8:53")})
	assert.Contains(t, miss.Text(), "not the proxy's: the node routes it as any other flow")
}

// TestExplainJSONSchema: the JSON form has exactly the fields the schema
// documents, nested ones too.
func TestExplainJSONSchema(t *testing.T) {
	var schema map[string]any
	require.NoError(t, json.Unmarshal([]byte(servicelb.ExplanationSchema), &schema))
	st := explainState(t)
	e := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("10.244.1.5:40000"), Dst: netip.MustParseAddrPort("203.0.113.10:80")})
	e2 := st.Explain(servicelb.Flow{Src: netip.MustParseAddrPort("198.51.100.9:40000"), Dst: netip.MustParseAddrPort("203.0.113.10:80"),
		InInterface: "eth0"})
	b, err := json.Marshal(&e2)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	keys := func(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
	// affinitySeconds is left out without affinity, and kernel is a
	// running proxy's: every other field is there.
	assert.Equal(t, slices.DeleteFunc(keys(schema), func(k string) bool { return k == "affinitySeconds" || k == "kernel" }), keys(got))
	kb, err := json.Marshal(servicelb.KernelCheck{Backend: "nftables"})
	require.NoError(t, err)
	var kernel map[string]any
	require.NoError(t, json.Unmarshal(kb, &kernel))
	assert.Equal(t, keys(schema["kernel"].(map[string]any)), keys(kernel), "kernel")
	for _, k := range []string{"flow", "frontend"} {
		assert.Equal(t, keys(schema[k].(map[string]any)), keys(got[k].(map[string]any)), k)
	}
	for _, k := range []string{"endpoints", "excluded"} {
		want := schema[k].([]any)[0].(map[string]any)
		list := got[k].([]any)
		require.NotEmpty(t, list, k)
		item := list[0].(map[string]any)
		assert.Subset(t, keys(want), keys(item), k)
	}
	_, err = json.Marshal(&e)
	require.NoError(t, err)
}

func TestKernelCheckText(t *testing.T) {
	ok := servicelb.KernelCheck{Backend: "nftables", Read: []string{"table inet kproxy", "chain services: 8 rules"}}
	assert.True(t, ok.Agrees())
	assert.Equal(t, "kernel      nftables agrees with the explanation\n"+
		"read        table inet kproxy\n"+
		"            chain services: 8 rules\n", ok.Text())
	bad := servicelb.KernelCheck{Backend: "nftables", Differences: []string{"chain x is missing"}}
	assert.False(t, bad.Agrees())
	assert.Contains(t, bad.Text(), "DIFFERS from the explanation in 1 place")
	assert.Contains(t, bad.Text(), "differs     chain x is missing")
}
