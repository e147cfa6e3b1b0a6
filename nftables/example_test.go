//go:build linux

package nftables_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// This example renders, as a dry run, what the table holds for one
// service: its cluster IP in the set of its verdicts' shape and in the
// set of its number of buckets, its endpoints in the endpoints map, and
// the shared chains that read them. Render needs no privileges and
// changes nothing; Sync would write the same table.
func ExampleProxier_Render() {
	node := servicelb.NodeConfig{NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
	st, err := servicelb.NewState(node, servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.2")},
			{Addr: netip.MustParseAddr("10.244.2.2")},
		},
	})
	if err != nil {
		panic(err)
	}
	p, err := nftables.New(nftables.Options{NoConntrackCleanup: true})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	text, err := p.Render(st)
	if err != nil {
		panic(err)
	}
	show := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "chain services {"), strings.HasPrefix(line, "chain cluster4 {"), strings.HasPrefix(line, "chain verdicts4/"):
			show = true
		case strings.Contains(line, "10.96.0.10 . tcp . 80"):
			fmt.Println(strings.TrimSuffix(strings.TrimPrefix(line, "elements = { "), " }"))
			continue
		}
		if show && !strings.Contains(line, "6 ") && !strings.Contains(line, "firewall") && !strings.Contains(line, "@service-cidrs") {
			fmt.Println(line)
		}
		show = show && line != "}"
	}
	// Output:
	// 10.96.0.10 . tcp . 80 . 0 : 10.244.1.2 . 8080,
	// 10.96.0.10 . tcp . 80 . 1 : 10.244.2.2 . 8080
	// 10.96.0.10 . tcp . 80
	// 10.96.0.10 . tcp . 80
	// chain services {
	// ip daddr . meta l4proto . th dport @verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq goto verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq
	// ip daddr . meta l4proto . th dport vmap @services4
	// ip daddr @cluster-ips4 reject with icmp port-unreachable
	// }
	// chain cluster4 {
	// ip daddr . meta l4proto . th dport @buckets4/cluster-2 meta l4proto @protocols4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints4
	// drop
	// }
	// chain verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq {
	// ip saddr != @pod-cidrs4 jump mark-for-masquerade
	// goto cluster4
	// drop
	// }
}
