package ipset_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"

	"github.com/kproxy-dev/kproxy/ipset"
	"github.com/vishvananda/netns"
)

// ExampleClient_Sync keeps kube-proxy's KUBE-CLUSTER-IP set (service IP,
// protocol and port) in a network namespace equal to the services'
// ports, and finds the set's index for an iptables set match. It needs
// CAP_NET_ADMIN and the kernel's ip_set modules, so it is not run as a
// test.
func ExampleClient_Sync() {
	ctx := context.Background()
	ns, err := netns.GetFromName("node")
	if err != nil {
		log.Fatal(err)
	}
	defer ns.Close()
	c, err := ipset.New(ipset.Options{NetNS: ns, Prefix: "KUBE-"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	set := ipset.Set{Name: "CLUSTER-IP", Type: ipset.HashIPPort, Family: ipset.IPv4, Comment: true}
	if err := c.Ensure(ctx, set); err != nil {
		log.Fatal(err)
	}
	res, err := c.Sync(ctx, set.Name, []ipset.Entry{
		{IP: netip.MustParseAddr("10.96.0.10"), Protocol: ipset.UDP, Port: 53, Comment: "kube-system/kube-dns:dns"},
		{IP: netip.MustParseAddr("10.96.0.10"), Protocol: ipset.TCP, Port: 53, Comment: "kube-system/kube-dns:dns-tcp"},
	})
	if err != nil {
		log.Fatal(err)
	}
	index, err := c.Index(ctx, set.Name)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d added, %d deleted, index %d\n", c.KernelName(set.Name), res.Added, res.Deleted, index)
}
