package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The cluster's network, all of it in network namespaces of its own:
//
//	kpe2e-net      bridge br0 (no address), one veth end per member
//	kpe2e-cp       eth0 10.0.0.1/24: etcd (on 127.0.0.1), the API server,
//	               controller manager, scheduler, CoreDNS and the tests;
//	               routes to each node's pod CIDR; no default route and no
//	               forwarding, so that nothing leaves the cluster
//	kpe2e-<node>   eth0 10.0.0.(10+i)/24, default route via 10.0.0.1,
//	               routes to the other nodes' pod CIDRs, forwarding on;
//	               containerd, kubelet, the proxy and the pods' veths
//
// Every veth is created with both ends in namespaces of the cluster
// (ip -n ... link add ... peer ... netns ...), so that no end ever exists
// in the root network namespace.
const (
	// NetNSPrefix starts the name of each of the cluster's namespaces.
	NetNSPrefix = "kpe2e-"
	// APIServerIP is the control plane's address.
	APIServerIP = "10.0.0.1"
	// ServiceCIDR holds the cluster IPs: the API server's service is
	// 10.96.0.1, the DNS service 10.96.0.10.
	ServiceCIDR = "10.96.0.0/16"
	// DNSServiceIP is the cluster IP of kube-system/kube-dns.
	DNSServiceIP = "10.96.0.10"
	// ClusterCIDR holds the pods' addresses: node i has 10.244.i.0/24.
	ClusterCIDR = "10.244.0.0/16"
	// ClusterDomain is the DNS domain of the services.
	ClusterDomain = "cluster.local"

	netNS    = NetNSPrefix + "net"
	cpNS     = NetNSPrefix + "cp"
	netnsDir = "/run/netns"
)

// nodeAddrs returns node i's (1-based) address and pod CIDR.
func nodeAddrs(i int) (netip.Addr, netip.Prefix) {
	return netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}),
		netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// nsPath returns the path of a named network namespace.
func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// ip runs iproute2's ip.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sysctl writes a sysctl of a namespace's network stack, by entering only
// that namespace: /proc/sys/net shows the network namespace of the
// process that opens it.
func sysctl(ctx context.Context, ns, key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+nsPath(ns), "--", "sh", "-c", `echo "$1" > "$2"`, "sh", value, path).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s=%s in %s: %w: %s", key, value, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// netUp creates the namespaces, the bridge and the links.
func (c *Cluster) netUp(ctx context.Context) error {
	members := []string{cpNS}
	for _, n := range c.Nodes {
		members = append(members, n.netns)
	}
	for _, ns := range append([]string{netNS}, members...) {
		if err := ip(ctx, "netns", "add", ns); err != nil {
			return err
		}
		if err := ip(ctx, "-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	if err := ip(ctx, "-n", netNS, "link", "add", "br0", "type", "bridge"); err != nil {
		return err
	}
	if err := ip(ctx, "-n", netNS, "link", "set", "br0", "up"); err != nil {
		return err
	}
	for i, ns := range members {
		port := fmt.Sprintf("p%d", i)
		steps := [][]string{
			{"-n", netNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
			{"-n", netNS, "link", "set", port, "master", "br0", "up"},
			{"-n", ns, "link", "set", "eth0", "up"},
		}
		for _, s := range steps {
			if err := ip(ctx, s...); err != nil {
				return err
			}
		}
	}
	if err := ip(ctx, "-n", cpNS, "addr", "add", APIServerIP+"/24", "dev", "eth0"); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := ip(ctx, "-n", cpNS, "route", "add", n.PodCIDR.String(), "via", n.IP.String()); err != nil {
			return err
		}
		steps := [][]string{
			{"-n", n.netns, "addr", "add", n.IP.String() + "/24", "dev", "eth0"},
			{"-n", n.netns, "route", "add", "default", "via", APIServerIP},
		}
		for _, o := range c.Nodes {
			if o.Name != n.Name {
				steps = append(steps, []string{"-n", n.netns, "route", "add", o.PodCIDR.String(), "via", o.IP.String()})
			}
		}
		for _, s := range steps {
			if err := ip(ctx, s...); err != nil {
				return err
			}
		}
		if err := sysctl(ctx, n.netns, "net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
	}
	return nil
}

// netDown deletes every namespace of the cluster (and of a crashed run):
// their links go with them.
func netDown(ctx context.Context) error {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	var errs []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), NetNSPrefix) {
			if err := ip(ctx, "netns", "delete", e.Name()); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
