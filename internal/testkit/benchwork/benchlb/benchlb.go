// Package benchlb makes servicelb's model of package benchwork's
// workload, for the benchmarks of the core: kproxy's driver of the
// comparison with kube-proxy (internal/testkit/cmd/kproxy-bench) and the IPVS
// backend's data-path benchmark in the VM. benchwork itself stays free of
// the core, for the bench module.
package benchlb

import (
	"net/netip"

	"github.com/kproxy-dev/kproxy/internal/testkit/benchwork"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Node is the workload's node with the given addresses (benchwork.NodeIP
// when none): benchwork.Node, its cluster and service CIDRs.
func Node(ips ...netip.Addr) servicelb.NodeConfig {
	if len(ips) == 0 {
		ips = []netip.Addr{netip.MustParseAddr(benchwork.NodeIP)}
	}
	return servicelb.NodeConfig{
		NodeName:     benchwork.Node,
		NodeIPs:      ips,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(benchwork.ClusterCIDR)},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(benchwork.ServiceCIDR)},
	}
}

// Service is w in servicelb's model: one TCP port 80 to 8080, every
// endpoint ready.
func Service(w benchwork.Service) servicelb.Service {
	eps := make([]servicelb.Endpoint, len(w.Endpoints))
	for j, e := range w.Endpoints {
		eps[j] = servicelb.Endpoint{Addr: e.Addr, NodeName: e.Node}
	}
	return servicelb.Service{
		Name:       benchwork.Namespace + "/" + w.Name,
		ClusterIPs: []netip.Addr{w.VIP},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints:  eps,
	}
}

// Workload returns the n services of m endpoints as benchwork has them
// (as kube-proxy's driver keeps them too), a Builder that holds them in
// servicelb's model, filled one service at a time, and their digest.
func Workload(n, m int) ([]benchwork.Service, *servicelb.Builder, string, error) {
	ws := benchwork.Generate(n, m)
	b, err := servicelb.NewBuilder(Node())
	if err != nil {
		return nil, nil, "", err
	}
	for _, w := range ws {
		if err := b.Upsert(Service(w)); err != nil {
			return nil, nil, "", err
		}
	}
	return ws, b, benchwork.Digest(ws), nil
}
