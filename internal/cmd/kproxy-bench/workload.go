package main

import (
	"net/netip"

	"github.com/kproxy-dev/kproxy/internal/benchwork"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// The workload is package benchwork's, which kube-proxy's driver builds
// its objects from too; this side makes servicelb's model of it.

func benchNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     benchwork.Node,
		NodeIPs:      []netip.Addr{netip.MustParseAddr(benchwork.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(benchwork.ClusterCIDR)},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(benchwork.ServiceCIDR)},
	}
}

// service is w in servicelb's model: one TCP port 80 to 8080, every
// endpoint ready.
func service(w benchwork.Service) servicelb.Service {
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

// workload returns the n services of m endpoints, as kube-proxy's driver
// keeps them too, a Builder that holds them, filled one service at a time,
// and their digest.
func workload(n, m int) ([]benchwork.Service, *servicelb.Builder, string, error) {
	ws := benchwork.Generate(n, m)
	b, err := servicelb.NewBuilder(benchNode())
	if err != nil {
		return nil, nil, "", err
	}
	for _, w := range ws {
		if err := b.Upsert(service(w)); err != nil {
			return nil, nil, "", err
		}
	}
	return ws, b, benchwork.Digest(ws), nil
}
