// Command embed is the smallest complete program that embeds kproxy: it
// load balances one service, 10.96.0.10:80, to the endpoints named on its
// command line, with the nftables backend, and prints the rules the
// kernel now holds. With --once it then removes them and exits; without,
// it keeps them until SIGINT or SIGTERM, then removes them.
//
//	sudo go run ./examples/embed --netns /run/netns/node1 --once 10.244.1.2 10.244.2.3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func main() {
	nsPath := flag.String("netns", "", "the network namespace to program, such as /run/netns/node1 (default: its own)")
	once := flag.Bool("once", false, "remove the rules and exit once they are in the kernel")
	flag.Parse()
	if err := run(*nsPath, *once, flag.Args()); err != nil {
		log.Fatal(err)
	}
}

func run(nsPath string, once bool, endpoints []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The namespace to program: its own, or the one named.
	ns := netns.None()
	if nsPath != "" {
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			return err
		}
		defer h.Close()
		ns = h
	}

	// The service and its endpoints.
	svc := servicelb.Service{
		Name:       "default/web",
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
	}
	for _, e := range endpoints {
		addr, err := netip.ParseAddr(e)
		if err != nil {
			return fmt.Errorf("endpoint %q: %w", e, err)
		}
		svc.Endpoints = append(svc.Endpoints, servicelb.Endpoint{Addr: addr})
	}

	// A backend, and a Runner that keeps the kernel in step with the
	// services its sources hand it.
	opts := nftables.Options{NetNS: ns}
	if err := nftables.Probe(opts); err != nil {
		return err
	}
	proxier, err := nftables.New(opts)
	if err != nil {
		return err
	}
	defer proxier.Close()
	runner, err := servicelb.NewRunner(proxier, servicelb.RunnerOptions{Node: servicelb.NodeConfig{NodeName: "node-1"}})
	if err != nil {
		return err
	}
	src := runner.Source("embed")
	if err := src.Upsert(svc); err != nil {
		return err
	}
	src.Synced()
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()

	// Ready once the kernel holds the first complete state.
	if err := runner.WaitSynced(ctx); err != nil {
		return err
	}
	rules, err := proxier.Render(runner.Applied())
	if err != nil {
		return err
	}
	fmt.Print(rules)
	if once {
		stop()
	}
	<-done
	return proxier.Cleanup(context.Background())
}
