//go:build linux

package nftables_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// This example renders, as a dry run, the chain the table gets for one
// service, and its entry in the dispatch map. Render needs no privileges
// and changes nothing; Sync would write the same table.
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
		case strings.HasPrefix(line, "chain svc4-default/web/http"):
			show = true
		case strings.Contains(line, ": goto svc4-"), strings.Contains(line, ". 8080"):
			line = strings.Replace(strings.TrimSuffix(line, " }"), " }\t#", "\t#", 1)
			fmt.Println(strings.TrimPrefix(line, "elements = { "))
			continue
		}
		if show {
			fmt.Println(line)
			show = line != "}"
		}
	}
	// Output:
	// 10.96.0.10 . tcp . 80 : goto svc4-default/web/http
	// 1639673856-1639675903 : 10.244.1.2 . 8080,	# default/web:http/ipv4
	// 1639675904-1639677950 : 10.244.2.2 . 8080	# default/web:http/ipv4
	// chain svc4-default/web/http {
	// ip saddr != @pod-cidrs4 jump mark-for-masquerade
	// meta l4proto tcp dnat ip to numgen random mod 4095 offset 1639673856 map @backends4-439
	// drop
	// }
}
