//go:build linux

package ebpf_test

import (
	"fmt"
	"net/netip"

	"github.com/kproxy-dev/kproxy/ebpf"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Render shows the maps a state makes, without privileges: here a service
// with a cluster IP and two endpoints, one of weight 2. The node's
// sockets and pods' are both sent to set 1 (a node with cluster CIDRs
// masquerades its own traffic, which the node's address toward the
// endpoint gives); endpoint .2 holds two of the three slots.
func ExampleProxier_Render() {
	p, err := ebpf.ForRendering(ebpf.Options{Cgroup: "/sys/fs/cgroup/kubepods"})
	if err != nil {
		panic(err)
	}
	st, err := servicelb.NewState(servicelb.NodeConfig{NodeName: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		servicelb.Service{
			Name:       "default/web",
			ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
			Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
			Endpoints: []servicelb.Endpoint{
				{Addr: netip.MustParseAddr("10.244.1.2"), Weight: servicelb.Weight(2)},
				{Addr: netip.MustParseAddr("10.244.2.2")},
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
	// map kp_config: node netns cookie 0
	// map kp_frontends: 1 entries
	//   10.96.0.10:80/tcp node=forward(1) pod=forward(1)  # default/web:http/ipv4 cluster IP
	// map kp_sets: 1 entries
	//   1 count=3 affinity=0s  # default/web:http/ipv4 cluster
	// map kp_slots: 3 entries
	//   1/0 10.244.1.2:8080
	//   1/1 10.244.1.2:8080
	//   1/2 10.244.2.2:8080
	// map kp_members: 0 entries
	// map kp_names: 1 entries
	//   1 "default/web:http/ipv4 cluster"
	// map kp_affinity: 0 entries (LRU of 16384, written by the hooks)
	// map kp_revnat: 0 entries (LRU of 65536, written by the hooks)
	// map kp_udpflows: 0 entries (LRU of 65536, written by the hooks)
}
