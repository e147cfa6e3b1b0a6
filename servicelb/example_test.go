package servicelb_test

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/servicelb/fake"
)

// A Runner feeds a Proxier from sources. Here one source adds a service with
// two endpoints, one of them draining, and an invalid service, which is
// reported and left out; the fake proxier shows what was applied.
func ExampleRunner() {
	p := &fake.Proxier{} // a real agent passes an nftables, iptables or ipvs Proxier
	r, err := servicelb.NewRunner(p, servicelb.RunnerOptions{
		Node: servicelb.NodeConfig{NodeName: "node-a", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
	})
	if err != nil {
		panic(err)
	}
	src := r.Source("file")
	web := servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080, NodePort: 30080}},
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.2"), NodeName: "node-a"},
			{Addr: netip.MustParseAddr("10.244.2.2"), NodeName: "node-b", Weight: servicelb.Weight(0)},
		},
	}
	broken := servicelb.Service{Name: "default/broken", Ports: []servicelb.Port{{Protocol: "ICMP", Port: 1}}}
	fmt.Println(src.Upsert(web, broken))
	src.Synced() // the source has delivered its initial contents

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	if _, err := p.WaitSyncs(ctx, 1); err != nil {
		panic(err)
	}
	out, _ := p.Render(p.Applied())
	fmt.Print(out)
	cancel()
	<-done
	// Output:
	// service "default/broken": ports[0].protocol "ICMP": unknown protocol
	// default/web:http/ipv4 tcp 10.96.0.10:80 nodePort=30080 -> 10.244.1.2:8080
}
