//go:build linux

package nftables

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// ownersOf returns, for each message of b, whose it is: the service of
// its port, "" for no one.
func ownersOf(b *nfnl.Batch) map[string][]string {
	out := map[string][]string{}
	for i := range b.Len() {
		o := ""
		if k, ok := b.Owner(i).(servicelb.ServicePortKey); ok {
			o = k.Service
		}
		out[o] = append(out[o], b.Describe(i))
	}
	return out
}

// TestBatchOwners: the batches that write the whole table and that apply
// a change say which service port each message is for: a port's chains
// and rules, and a message of elements that holds one port's alone. The
// node's chains, the sets, and elements several ports or none hold are
// no one's.
func TestBatchOwners(t *testing.T) {
	web := servicelb.Service{
		Name: "default/web", ClusterIPs: addrs("10.96.0.10"), ExternalIPs: addrs("198.51.100.10"),
		Ports:     []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: eps("", "10.244.1.2", "10.244.2.2"),
	}
	dns := servicelb.Service{
		Name: "default/dns", ClusterIPs: addrs("10.96.0.53"),
		Ports:     []servicelb.Port{{Name: "dns", Protocol: servicelb.UDP, Port: 53}},
		Endpoints: eps("", "10.244.1.5"),
	}
	p := newPlanner("kproxy", DefaultAffinitySize)
	st := state(t, testNode, web, dns)
	m, err := p.build(st)
	require.NoError(t, err)
	var b nfnl.Batch
	require.NoError(t, p.write(m, &b))
	owners := ownersOf(&b)
	for svc, msgs := range owners {
		for _, msg := range msgs {
			port := strings.Contains(msg, "svc4-") || strings.Contains(msg, "ep4-")
			switch {
			case svc == "" && port && !strings.Contains(msg, "elements"):
				t.Errorf("%q is no one's", msg)
			case svc != "" && !strings.Contains(msg, "elements") && !strings.Contains(msg, "-"+svc+"/"):
				t.Errorf("%q is %s's", msg, svc)
			}
		}
	}
	require.NotEmpty(t, owners["default/web"])
	require.NotEmpty(t, owners["default/dns"])
	assert.Contains(t, owners[""], "add elements inet kproxy verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq (2 elements)",
		"the ports share the message of their shape's set")

	// A service added: its messages are its own, elements and all but
	// those of the elements ports share.
	api := servicelb.Service{
		Name: "default/api", ClusterIPs: addrs("10.96.0.20"),
		Ports:     []servicelb.Port{{Name: "grpc", Protocol: servicelb.TCP, Port: 9090}},
		Endpoints: eps("", "10.244.3.3"),
	}
	next := state(t, testNode, web, dns, api)
	ch := servicelb.Diff(st, next)
	s, err := p.plan(m, &ch, next)
	require.NoError(t, err)
	var d nfnl.Batch
	require.NoError(t, s.delta(m).batch("kproxy", &d))
	owners = ownersOf(&d)
	assert.Equal(t, []string{"default/api", ""}, keys(owners), "%v", owners)
	assert.ElementsMatch(t, []string{
		"add elements inet kproxy verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq (1 element)",
		"add elements inet kproxy buckets4/cluster-1 (1 element)",
		"add elements inet kproxy endpoints4 (1 element)",
	}, owners["default/api"])
	assert.Equal(t, []string{"add elements inet kproxy cluster-ips4 (1 element)",
		"add elements inet kproxy hairpin4 (1 element)"}, owners[""], "a cluster IP and a hairpin pair, which ports share, are no one's")
}

func keys(m map[string][]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	if len(out) == 2 && out[0] == "" {
		out[0], out[1] = out[1], out[0]
	}
	return out
}
