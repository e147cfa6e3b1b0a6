//go:build linux

package iptables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// shapesNode is a node with two IPv4 addresses and two IPv4 cluster
// CIDRs.
func shapesNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     "node-a",
		NodeIPs:      addrs("198.51.100.1", "198.51.100.9", "fd00:c::1"),
		ClusterCIDRs: prefixes("10.244.0.0/16", "10.245.0.0/16", "fd00:244::/48"),
	}
}

// shapesPorts are service ports, made by hand, whose verdicts servicelb
// does not give today: the rules must render any verdict. Origins whose
// flows are not forwarded while others are, masquerade for the node
// alone, a rejected origin behind source ranges, a node port on one of
// two node addresses.
func shapesPorts() []*servicelb.ServicePort {
	be := func(a string, local bool) servicelb.Backend {
		return servicelb.Backend{Addr: netip.MustParseAddr(a), Port: 8080, Weight: 1, Local: local, Ready: true}
	}
	v := func(a servicelb.Action, masq bool) servicelb.Verdict {
		return servicelb.Verdict{Action: a, Masquerade: masq}
	}
	cluster, local := []servicelb.Backend{be("10.244.1.2", true), be("10.244.2.2", false)}, []servicelb.Backend{be("10.244.1.2", true)}
	port := func(svc string, p uint16, np uint16) servicelb.ServicePort {
		return servicelb.ServicePort{Key: servicelb.ServicePortKey{Service: svc, Family: servicelb.IPv4}, Family: servicelb.IPv4,
			Port: servicelb.Port{Protocol: servicelb.TCP, Port: p, NodePort: np}, Cluster: cluster, Local: local}
	}
	// The cluster IP: pods dropped, the node refused, the rest forwarded.
	mixed := port("odd/mixed", 80, 0)
	mixed.ClusterIP = netip.MustParseAddr("10.96.5.1")
	mixed.Internal = servicelb.Verdicts{v(servicelb.ToCluster, true), v(servicelb.Drop, false), v(servicelb.Reject, false)}
	mixed.External = servicelb.Verdicts{v(servicelb.ToCluster, true), v(servicelb.ToCluster, true), v(servicelb.ToCluster, true)}
	// The cluster IP masqueraded for the node alone; pods take the local
	// set, the rest the cluster set.
	masq := port("odd/masq", 81, 0)
	masq.ClusterIP = netip.MustParseAddr("10.96.5.2")
	masq.Internal = servicelb.Verdicts{v(servicelb.ToCluster, false), v(servicelb.ToLocal, false), v(servicelb.ToCluster, true)}
	masq.External = masq.Internal
	// A load-balancer IP with source ranges whose pods are refused, and
	// a node port on one node address: outside dropped, the node refused,
	// pods forwarded masqueraded.
	ext := port("odd/ext", 82, 30082)
	ext.LoadBalancerIPs = addrs("203.0.113.5")
	ext.SourceRanges = prefixes("192.0.2.0/24")
	ext.NodeIPs = addrs("198.51.100.9")
	ext.Internal = servicelb.Verdicts{v(servicelb.Reject, false), v(servicelb.Reject, false), v(servicelb.Reject, false)}
	ext.External = servicelb.Verdicts{v(servicelb.ToLocal, false), v(servicelb.Reject, false), v(servicelb.ToCluster, true)}
	np := port("odd/nodeport", 83, 30083)
	np.NodeIPs = addrs("198.51.100.9")
	np.External = servicelb.Verdicts{v(servicelb.Drop, false), v(servicelb.ToCluster, true), v(servicelb.Reject, false)}
	return []*servicelb.ServicePort{&mixed, &masq, &ext, &np}
}

// TestRenderShapes renders ports whose verdicts servicelb does not give
// today (a golden file shows how), and checks that every origin gets its
// verdict: the rules' targets by origin, rule by rule.
func TestRenderShapes(t *testing.T) {
	px := newOffline(t, Options{Families: []servicelb.Family{servicelb.IPv4}})
	node := shapesNode()
	want, err := px.portsContent(&node, shapesPorts())
	require.NoError(t, err)
	text, err := renderFamily(want, servicelb.IPv4)
	require.NoError(t, err)
	golden(t, "shapes.golden", text)
	ports := shapesPorts()
	mixed, masq, ext, np := ports[0], ports[1], ports[2], ports[3]
	has := func(format string, chains ...any) {
		t.Helper()
		line := fmt.Sprintf(format, chains...)
		require.True(t, strings.Contains(text, line+"\n"), "no line %q", line)
	}
	n := px.n
	// mixed: pods and the node are not translated and reach the filter
	// table, which drops the pods and refuses the node.
	has(`-A KPROXY-SERVICES -s 10.244.0.0/16 -d 10.96.5.1/32 -p tcp -m comment --comment "odd/mixed cluster IP" -m tcp --dport 80 -j RETURN`)
	has(`-A KPROXY-SERVICES -s 10.245.0.0/16 -d 10.96.5.1/32 -p tcp -m comment --comment "odd/mixed cluster IP" -m tcp --dport 80 -j RETURN`)
	has(`-A KPROXY-SERVICES -d 10.96.5.1/32 -p tcp -m comment --comment "odd/mixed cluster IP" -m tcp --dport 80 -j %s`, n.svc(mixed))
	has(`-A KPROXY-SERVICES -s 10.244.0.0/16 -d 10.96.5.1/32 -p tcp -m comment --comment "odd/mixed has no local endpoints" -m tcp --dport 80 -j DROP`)
	has(`-A KPROXY-SERVICES -d 10.96.5.1/32 -p tcp -m comment --comment "odd/mixed has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable`)
	// masq: pods to the local set, the rest to the cluster set; marked
	// for the node, the mark cleared again for pods on a local address.
	has(`-A KPROXY-SERVICES -s 10.245.0.0/16 -d 10.96.5.2/32 -p tcp -m comment --comment "odd/masq cluster IP" -m tcp --dport 81 -j %s`, n.svl(masq))
	has(`-A KPROXY-SERVICES -d 10.96.5.2/32 -p tcp -m comment --comment "odd/masq cluster IP" -m tcp --dport 81 -j %s`, n.svc(masq))
	for _, chain := range []string{n.svc(masq), n.svl(masq)} {
		has(`-A %s -d 10.96.5.2/32 -p tcp -m comment --comment "odd/masq cluster IP" -m addrtype --src-type LOCAL -m tcp --dport 81 -j KPROXY-MARK-MASQ`, chain)
		has(`-A %s -s 10.244.0.0/16 -d 10.96.5.2/32 -p tcp -m comment --comment "odd/masq cluster IP" -m tcp --dport 81 -j MARK --set-xmark 0x0/0x4000`, chain)
	}
	// ext: the allowed sources go to EXT without return; pods come back
	// from it and are refused.
	has(`-A %s -s 192.0.2.0/24 -m comment --comment "odd/ext loadbalancer IP" -g %s`, n.fw(ext), n.ext(ext))
	has(`-A %s -s 10.244.0.0/16 -m comment --comment "pod traffic for odd/ext external destinations" -j RETURN`, n.ext(ext))
	has(`-A %s -j %s`, n.ext(ext), n.svl(ext))
	has(`-A KPROXY-EXTERNAL-SERVICES -d 203.0.113.5/32 -p tcp -m comment --comment "odd/ext has no endpoints" -m tcp --dport 82 -j REJECT --reject-with icmp-port-unreachable`)
	// nodeport: on one node address; pods forwarded masqueraded, the
	// node refused, the rest dropped.
	has(`-A KPROXY-NODEPORTS -d 198.51.100.9/32 -p tcp -m comment --comment "odd/nodeport" -m tcp --dport 30083 -j %s`, n.ext(np))
	has(`-A %s -s 10.244.0.0/16 -m comment --comment "masquerade pod traffic for odd/nodeport external destinations" -j KPROXY-MARK-MASQ`, n.ext(np))
	has(`-A %s -s 10.244.0.0/16 -m comment --comment "pod traffic for odd/nodeport external destinations" -j %s`, n.ext(np), n.svc(np))
	has(`-A %s -m comment --comment "route LOCAL traffic for odd/nodeport external destinations" -m addrtype --src-type LOCAL -j RETURN`, n.ext(np))
	has(`-A KPROXY-EXTERNAL-SERVICES -d 198.51.100.9/32 -p tcp -m comment --comment "odd/nodeport has no endpoints" -m addrtype --src-type LOCAL -m tcp --dport 30083 -j REJECT --reject-with icmp-port-unreachable`)
	has(`-A KPROXY-EXTERNAL-SERVICES -d 198.51.100.9/32 -p tcp -m comment --comment "odd/nodeport has no local endpoints" -m tcp --dport 30083 -j DROP`)
	require.NotContains(t, text, `-s 10.244.0.0/16 -d 198.51.100.9/32`, "filter rules for pods, whose flows are forwarded")
}
