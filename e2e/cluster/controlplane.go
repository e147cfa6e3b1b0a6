package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// controlPlane names the control plane's cgroup and its log files' start.
const controlPlane = "control-plane"

// controlPlaneUp starts etcd, the API server, the controller manager and
// the scheduler in the control plane's namespace, and waits for the API
// server to be ready.
func (c *Cluster) controlPlaneUp(ctx context.Context) error {
	dir := filepath.Join(c.cfg.Dir, controlPlane)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		return fmt.Errorf("etcd: %w (Debian's etcd-server)", err)
	}
	in := enter{netns: cpNS}
	_, err = c.start("etcd", controlPlane, in, []string{etcdBin,
		"--name", "e2e", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e2e=http://127.0.0.1:2380"})
	if err != nil {
		return err
	}
	p := c.pki
	api, err := c.start("kube-apiserver", controlPlane, in, []string{c.bin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--bind-address", "0.0.0.0", "--advertise-address", APIServerIP, "--secure-port", "6443",
		"--tls-cert-file", p.ServerCert, "--tls-private-key-file", p.Server,
		"--client-ca-file", p.CA, "--token-auth-file", p.Tokens,
		"--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		"--service-account-issuer", "https://kubernetes.default.svc." + ClusterDomain,
		"--service-account-key-file", p.SAPub, "--service-account-signing-key-file", p.SAKey,
		"--service-cluster-ip-range", ServiceCIDR,
		// kubectl exec and logs reach kubelet by its address: the node's
		// name resolves nowhere here.
		"--kubelet-preferred-address-types", "InternalIP",
		"--profiling=false",
	})
	if err != nil {
		return err
	}
	if err := api.wait(ctx, "kube-apiserver /readyz", 2*time.Minute, c.readyz); err != nil {
		return err
	}
	kc := filepath.Join(dir, "kubeconfig")
	if err := p.kubeconfig(kc, "https://127.0.0.1:6443"); err != nil {
		return err
	}
	if _, err := c.start("kube-controller-manager", controlPlane, in, []string{c.bin("kube-controller-manager"),
		"--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
		"--bind-address", "127.0.0.1", "--leader-elect=false",
		"--service-account-private-key-file", p.SAKey, "--root-ca-file", p.CA,
		"--use-service-account-credentials",
		// The nodes' pod CIDRs are fixed in their CNI configurations.
		"--allocate-node-cidrs=false", "--cluster-cidr", ClusterCIDR,
		"--service-cluster-ip-range", ServiceCIDR,
		"--profiling=false",
	}); err != nil {
		return err
	}
	_, err = c.start("kube-scheduler", controlPlane, in, []string{c.bin("kube-scheduler"),
		"--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
		"--bind-address", "127.0.0.1", "--leader-elect=false", "--profiling=false",
	})
	return err
}

// readyz asks the API server's /readyz from the control plane's
// namespace.
func (c *Cluster) readyz() error {
	out, err := exec.Command("nsenter", "--net="+nsPath(cpNS), "--", c.bin("kubectl"),
		"--kubeconfig", c.Kubeconfig, "get", "--raw", "/readyz").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.cfg.Bin, name) }

// dnsUp starts CoreDNS in the control plane's namespace, on the API
// server's address, and gives it the service kube-system/kube-dns
// (10.96.0.10, 53/UDP and 53/TCP) with a hand-made EndpointSlice to that
// address: the pods reach their DNS server through the proxy, as in a
// cluster whose DNS runs in pods.
func (c *Cluster) dnsUp(ctx context.Context) error {
	dir := filepath.Join(c.cfg.Dir, controlPlane)
	corefile := filepath.Join(dir, "Corefile")
	conf := fmt.Sprintf(`.:53 {
    bind %s
    errors
    kubernetes %s in-addr.arpa ip6.arpa {
        kubeconfig %s kproxy-e2e
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30 {
        disable success %[2]s
        disable denial %[2]s
    }
    loadbalance
}
`, APIServerIP, ClusterDomain, c.Kubeconfig)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		return err
	}
	if _, err := c.start("coredns", controlPlane, enter{netns: cpNS}, []string{c.cfg.CoreDNS, "-conf", corefile}); err != nil {
		return err
	}
	manifest := filepath.Join(dir, "kube-dns.yaml")
	if err := os.WriteFile(manifest, []byte(kubeDNS), 0o644); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "apply", "-f", manifest)
	return err
}

// kubeDNS is the DNS service: no selector, and an EndpointSlice of the
// control plane's address, where CoreDNS listens.
const kubeDNS = `apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
    kubernetes.io/name: CoreDNS
spec:
  clusterIP: ` + DNSServiceIP + `
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-control-plane
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: kproxy-e2e
addressType: IPv4
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
endpoints:
- addresses: [` + APIServerIP + `]
  conditions: {ready: true}
`
