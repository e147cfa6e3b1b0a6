//go:build linux

package ipvs_test

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// ExampleRender shows the IPVS table a Proxier installs for a service with
// a cluster IP, a node port and two endpoints, without touching the kernel.
func ExampleRender() {
	node := servicelb.NodeConfig{NodeName: "node-a", NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	st, err := servicelb.NewState(node, servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, NodePort: 30080, TargetPort: 8080}},
		Scheduler:  servicelb.SchedulerWeightedRR,
		Endpoints: []servicelb.Endpoint{
			{Addr: netip.MustParseAddr("10.244.1.5"), Weight: servicelb.Weight(2)},
			{Addr: netip.MustParseAddr("10.244.2.7")},
		},
	})
	if err != nil {
		panic(err)
	}
	text, err := ipvs.Render(st, ipvs.Options{})
	if err != nil {
		panic(err)
	}
	ipvsadm, _, _ := strings.Cut(text, ipvs.SectionAddresses)
	fmt.Print(ipvsadm)
	// Output:
	// # ipvsadm -Sn
	// -A -t 192.0.2.10:30080 -s wrr
	// -a -t 192.0.2.10:30080 -r 10.244.1.5:8080 -m -w 2
	// -a -t 192.0.2.10:30080 -r 10.244.2.7:8080 -m -w 1
	// -A -t 10.96.0.10:80 -s wrr
	// -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 2
	// -a -t 10.96.0.10:80 -r 10.244.2.7:8080 -m -w 1
}
