// Command kubeproxy is a whole Kubernetes node proxy built on kproxy, as
// an embedder writes one with the kube module and no more: Services and
// EndpointSlices from the API server, programmed with nftables; the
// node's addresses, zone and the cluster's service CIDRs followed from
// the Node and the ServiceCIDRs; node ports on every local address; and
// kube-proxy's metrics.
//
//	sudo go run ./examples/kubeproxy --kubeconfig ~/.kube/config --cluster-cidr 10.244.0.0/16
package main

import (
	"context"
	"flag"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/kube"
	"github.com/kproxy-dev/kproxy/kube/metrics"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/nodeaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster)")
	nodeName := flag.String("hostname-override", "", "this node's name (default: the hostname)")
	clusterCIDR := flag.String("cluster-cidr", "", "the pods' CIDR: traffic from elsewhere is masqueraded")
	metricsAddr := flag.String("metrics-bind-address", "127.0.0.1:10249", "where kube-proxy's metrics are served")
	nsPath := flag.String("netns", "", "the network namespace to program, such as /run/netns/node1 (default: its own)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	name, _ := os.Hostname()
	node := servicelb.NodeConfig{NodeName: kube.NodeName(name)}
	if *nodeName != "" {
		node.NodeName = kube.NodeName(*nodeName)
	}
	if *clusterCIDR != "" {
		node.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix(*clusterCIDR)}
	}
	ns := netns.None()
	if *nsPath != "" {
		ns = must(netns.GetFromPath(*nsPath))
	}
	client := must(kube.NewClient(kube.ClientOptions{Kubeconfig: *kubeconfig}))
	proxier := must(nftables.New(nftables.Options{NetNS: ns, Logger: log}))
	node.LocalIPs = must(nodeaddr.List(nodeaddr.Options{NetNS: ns}))
	reg := prometheus.NewRegistry()
	var runner *servicelb.Runner
	m := metrics.NewKubeProxy(reg, func() servicelb.Health { return runner.Health() })
	runner = must(servicelb.NewRunner(proxier, servicelb.RunnerOptions{Node: node, Logger: log, Hooks: m.Hooks()}))

	// The Node, the ServiceCIDRs and the local addresses each edit the
	// node; the runner applies each edit from its next sync.
	var mu sync.Mutex
	update := func(edit func(*servicelb.NodeConfig)) {
		mu.Lock()
		defer mu.Unlock()
		next := node
		edit(&next)
		if err := runner.SetNode(next); err != nil {
			log.Error("node change refused", "err", err)
			return
		}
		node = next
	}
	src := &kube.Source{Client: client, NodeName: node.NodeName, Logger: log,
		OnNode:         func(n kube.Node) { update(func(c *servicelb.NodeConfig) { c.NodeIPs, c.Zone = n.IPs, n.Zone }) },
		OnServiceCIDRs: func(p []netip.Prefix) { update(func(c *servicelb.NodeConfig) { c.ServiceCIDRs = p }) },
	}
	dst := runner.Source(src.Name())
	go func() { _ = http.ListenAndServe(*metricsAddr, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) }()
	go func() {
		w := nodeaddr.Watcher{Options: nodeaddr.Options{NetNS: ns}}
		_ = w.Run(ctx, func(a []netip.Addr) { update(func(c *servicelb.NodeConfig) { c.LocalIPs = a }) })
	}()
	go func() {
		_ = src.Run(ctx, dst, func(obj string, err error) { log.Warn("left out", "object", obj, "err", err) })
		stop()
	}()
	_ = runner.Run(ctx)
}

func must[T any](v T, err error) T {
	if err != nil {
		slog.Error("kubeproxy", "err", err)
		os.Exit(1)
	}
	return v
}
