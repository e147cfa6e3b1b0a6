package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The workload, shared by formula with the kube-proxy driver of the bench
// module (bench/internal/workload), which compares the digests of the two:
// n ClusterIP services of one TCP port (80 to 8080), each with m ready
// endpoints of addresses of their own; the first endpoint of every tenth
// service is on this node (node-0), the others are spread over 99 more.

// clusterIP is service i's address, in 172.16.0.0/12.
func clusterIP(i int) netip.Addr {
	x := i + 1
	return netip.AddrFrom4([4]byte{172, 16 + byte(x>>16), byte(x >> 8), byte(x)})
}

// endpointIP is the x-th endpoint address, in 10.64.0.0/10 (base
// endpoints from 10.64.0.1, replacements from 10.100.0.1, added services'
// endpoints from 10.110.0.1).
func endpointIP(base byte, x int) netip.Addr {
	x++
	return netip.AddrFrom4([4]byte{10, base + byte(x>>16), byte(x >> 8), byte(x)})
}

// nodeOf is the node of service i's j-th endpoint.
func nodeOf(i, j, m int) string {
	if j == 0 && i%10 == 0 {
		return "node-0"
	}
	return "node-" + strconv.Itoa(1+(i*m+j)%99)
}

func serviceName(i int) string { return "svc-" + strconv.Itoa(i) }

const namespace = "bench"

func benchNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     "node-0",
		NodeIPs:      []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/10")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
	}
}

func service(name string, vip netip.Addr, eps []servicelb.Endpoint) servicelb.Service {
	return servicelb.Service{
		Name:       namespace + "/" + name,
		ClusterIPs: []netip.Addr{vip},
		Ports:      []servicelb.Port{{Name: "http", Protocol: servicelb.TCP, Port: 80, TargetPort: 8080}},
		Endpoints:  eps,
	}
}

func workload(n, m int) []servicelb.Service {
	out := make([]servicelb.Service, n)
	for i := range out {
		eps := make([]servicelb.Endpoint, m)
		for j := range eps {
			eps[j] = servicelb.Endpoint{Addr: endpointIP(64, i*m+j), Ready: true, Serving: true, NodeName: nodeOf(i, j, m)}
		}
		out[i] = service(serviceName(i), clusterIP(i), eps)
	}
	return out
}

// digest is a hash of the workload's canonical text, which both drivers
// compute from what they hand their proxier.
func digest(svcs []servicelb.Service) string {
	h := sha256.New()
	for _, s := range svcs {
		fmt.Fprintf(h, "%s %s %d>%d", s.Name, s.ClusterIPs[0], s.Ports[0].Port, s.Ports[0].TargetPort)
		for _, e := range s.Endpoints {
			fmt.Fprintf(h, " %s@%s", e.Addr, e.NodeName)
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// changeTarget is the service the k-th one-endpoint change replaces an
// endpoint of (never a probed one), and which endpoint.
func changeTarget(k, n, m int) (svc, ep int) {
	svc = (k*7919 + 13) % n
	for svc == 0 || svc == n/2 || svc == n-1 {
		svc = (svc + 1) % n
	}
	return svc, k % m
}
