package conntrack_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kproxy-dev/kproxy/conntrack"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/vishvananda/netns"
)

// After a sync, delete the flows the change left stale in the namespace a
// proxier programs. It needs CAP_NET_ADMIN, so it is not run as a test.
func ExampleClient_DeleteStale() {
	ns, err := netns.GetFromName("node") // or netns.None() for this namespace
	if err != nil {
		log.Fatal(err)
	}
	defer ns.Close()
	c, err := conntrack.New(conntrack.Options{NetNS: ns})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var before, after *servicelb.State // the states the proxier applied
	changes := servicelb.Diff(before, after)
	n, err := c.DeleteStale(context.Background(), changes.StaleFlows())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted", n, "stale flows")
}
