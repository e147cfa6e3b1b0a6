//go:build linux

package userspace_test

import (
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// This example sets up the unprivileged proxy of a developer laptop: the
// service "default/web" is served on 127.0.0.1:18080, a port of its own,
// and spread over two endpoints; Render shows, as a dry run, what Sync
// would serve. Neither needs a privilege; Render changes nothing.
func ExampleProxier_Render() {
	web := servicelb.ServicePortKey{Service: "default/web", Port: "http", Family: servicelb.IPv4}
	p, err := userspace.New(userspace.Options{
		Listen: userspace.ListenAt(map[servicelb.ServicePortKey]netip.AddrPort{
			web: netip.MustParseAddrPort("127.0.0.1:18080"),
		}),
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.MustParseAddr("192.168.49.2")},
			{Addr: netip.MustParseAddr("192.168.49.3"), Weight: servicelb.Weight(3)},
		},
	})
	if err != nil {
		panic(err)
	}
	text, err := p.Render(st)
	if err != nil {
		panic(err)
	}
	fmt.Print(text)
	// Output:
	// # kproxy userspace proxy
	//
	// port default/web:http/ipv4 tcp
	//   listen 127.0.0.1:18080 for cluster IP: outside=cluster pod=cluster node=cluster
	//   cluster: 192.168.49.2:8080 weight 1 192.168.49.3:8080 weight 3
}
