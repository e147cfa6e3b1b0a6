// Package proxy deploys a node proxy into a test cluster the way its users
// deploy it: kproxy by the project's own manifests (deploy/kubernetes and
// the backends' variants in deploy/backends), kube-proxy by kubeadm's own
// addon phase (kubeadm init phase addon kube-proxy), each with the few
// settings the cluster decides (its API server's address, the image's
// name) and nothing else changed; and kproxy as a drop-in
// (kproxy-kubeadm): kubeadm's kube-proxy DaemonSet and ConfigMap, with
// only the image replaced by kproxy's.
package proxy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kproxy-dev/kproxy/e2e/build"
	"github.com/kproxy-dev/kproxy/e2e/cluster"
)

// Proxy is a node proxy and its backend, such as kproxy with nftables.
type Proxy struct {
	// Name is "<program>-<backend>", such as kproxy-nftables or
	// kube-proxy-iptables: the report's column.
	Name string
	// Program is kproxy or kube-proxy.
	Program string
	// Backend is the dataplane: nftables, iptables, ebpf or userspace
	// (kproxy), nftables or iptables (kube-proxy's modes).
	Backend string
	// Kubeadm deploys kproxy by kubeadm's kube-proxy addon, its command
	// line and its ConfigMap (no mode: kube-proxy's default, iptables), with
	// the image replaced by kproxy's.
	Kubeadm bool
}

// All are the proxies this machine can run, kube-proxy's modes beside
// kproxy's backends of the same dataplane. kproxy's ipvs backend needs
// the ip_vs modules, which this machine's kernel lacks: its semantics are
// proven by the conformance kit in a VM (make test-vm).
var All = []Proxy{
	{"kube-proxy-nftables", "kube-proxy", "nftables", false},
	{"kproxy-nftables", "kproxy", "nftables", false},
	{"kube-proxy-iptables", "kube-proxy", "iptables", false},
	{"kproxy-iptables", "kproxy", "iptables", false},
	{"kproxy-ebpf", "kproxy", "ebpf", false},
	{"kproxy-userspace", "kproxy", "userspace", false},
	{"kproxy-kubeadm", "kproxy", "iptables", true},
}

// Lookup returns the proxy of a name of All.
func Lookup(name string) (Proxy, error) {
	for _, p := range All {
		if p.Name == name {
			return p, nil
		}
	}
	var names []string
	for _, p := range All {
		names = append(names, p.Name)
	}
	return Proxy{}, fmt.Errorf("proxy %q: want one of %s", name, strings.Join(names, ", "))
}

// KubeProxy reports whether the proxy is kube-proxy.
func (p Proxy) KubeProxy() bool { return p.Program == "kube-proxy" }

// Env is what a deployment takes from outside the cluster.
type Env struct {
	// Repo is the project's checkout (its deploy/ directory).
	Repo string
	// KubeadmBin is kubeadm of the cluster's release.
	KubeadmBin string
	// KProxyImage is the name kproxy's image was imported under.
	KProxyImage string
	// Dir is where the deployment's files are written.
	Dir string
}

// Deploy deploys the proxy and waits until its DaemonSet is ready on
// every node.
func (p Proxy) Deploy(ctx context.Context, c *cluster.Cluster, env Env) error {
	if err := os.MkdirAll(env.Dir, 0o755); err != nil {
		return err
	}
	var ds string
	var err error
	if p.KubeProxy() || p.Kubeadm {
		ds, err = p.deployKubeProxy(ctx, c, env)
	} else {
		ds, err = p.deployKProxy(ctx, c, env)
	}
	if err != nil {
		return fmt.Errorf("deploy %s: %w", p.Name, err)
	}
	if _, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "daemonset/"+ds, "--timeout=180s"); err != nil {
		return fmt.Errorf("deploy %s: %w", p.Name, err)
	}
	return nil
}

// deployKubeProxy runs kubeadm's addon phase with a kubeadm configuration
// of the cluster: kubeadm writes kube-proxy's ServiceAccount, RBAC,
// ConfigMap and DaemonSet as it does for its own clusters.
func (p Proxy) deployKubeProxy(ctx context.Context, c *cluster.Cluster, env Env) (string, error) {
	cfg := filepath.Join(env.Dir, "kubeadm.yaml")
	mode := p.Backend
	if p.Kubeadm {
		mode = "" // kubeadm's default: kube-proxy's, iptables
	}
	if err := os.WriteFile(cfg, []byte(kubeadmConfig(mode)), 0o644); err != nil {
		return "", err
	}
	cmd := c.Command(ctx, env.KubeadmBin, "init", "phase", "addon", "kube-proxy", "--config", cfg, "--kubeconfig", c.Kubeconfig)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubeadm: %w: %s", err, out)
	}
	if p.Kubeadm {
		if _, err := c.Kubectl(ctx, "-n", "kube-system", "set", "image", "daemonset/kube-proxy", "kube-proxy="+env.KProxyImage); err != nil {
			return "", err
		}
	}
	return "kube-proxy", nil
}

// kubeadmConfig is a kubeadm configuration of the cluster whose kube-proxy
// runs in mode. Its KubeProxyConfiguration sets the mode and one thing
// more: conntrack.maxPerCore 0, so that kube-proxy leaves nf_conntrack_max
// and the conntrack table's hash size alone; they are the machine's, not
// the node's (its default would raise the hash size of the whole host
// when it finds it below a quarter of 131,072). The certificates
// directory names none, so that kubeadm takes the cluster's CA as
// external and checks no file of it.
func kubeadmConfig(mode string) string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: %[1]s
  bindPort: 6443
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: %[2]s
controlPlaneEndpoint: %[1]s:6443
certificatesDir: /nonexistent/kproxy-e2e-pki
networking:
  serviceSubnet: %[3]s
  podSubnet: %[4]s
  dnsDomain: %[5]s
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %[6]s
conntrack:
  maxPerCore: 0
`, cluster.APIServerIP, build.KubernetesVersion,
		cluster.ServiceCIDR, cluster.ClusterCIDR, cluster.ClusterDomain, mode)
}

// deployKProxy applies the project's manifests of the backend through a
// kustomization of the cluster's own: the API server's address in the
// kubeconfig kproxy reads, the image's name, and, for ebpf, the node's
// cgroup.
func (p Proxy) deployKProxy(ctx context.Context, c *cluster.Cluster, env Env) (string, error) {
	base := filepath.Join(env.Repo, "deploy", "kubernetes")
	if p.Backend != "nftables" {
		base = filepath.Join(env.Repo, "deploy", "backends", p.Backend)
	}
	// kustomize takes a base by a relative path only.
	rel, err := filepath.Rel(env.Dir, base)
	if err != nil {
		return "", err
	}
	name, tag, _ := strings.Cut(env.KProxyImage, ":")
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: kproxy
  newName: %s
  newTag: %s
patches:
- target: {kind: ConfigMap, name: kproxy}
  patch: |-
    - op: replace
      path: /data/kubeconfig.conf
      value: |
%s
`, rel, name, tag, indent(kproxyKubeconfig(), 8))
	if p.Backend == "ebpf" {
		k += ebpfPatch(c.Nodes[0])
	}
	if err := os.WriteFile(filepath.Join(env.Dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return "", err
	}
	if _, err := c.Kubectl(ctx, "apply", "-k", env.Dir); err != nil {
		return "", err
	}
	return "kproxy", nil
}

// kproxyKubeconfig is deploy/kubernetes's kubeconfig with the cluster's
// API server.
func kproxyKubeconfig() string {
	return `apiVersion: v1
kind: Config
clusters:
  - name: default
    cluster:
      server: https://` + cluster.APIServerIP + `:6443
      certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
  - name: default
    user:
      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
  - name: default
    context:
      cluster: default
      namespace: kube-system
      user: default
current-context: default`
}

// ebpfPatch points the ebpf backend's hooks at the node's cgroup in the
// host's cgroup v2 hierarchy, which every process of the node and of its
// pods is in (Node.Cgroup), instead of the hierarchy's root; the base
// mounts the host's /sys/fs/cgroup at /host/cgroup. The flag comes after
// the base's --cgroup, and the last one counts.
func ebpfPatch(n *cluster.Node) string {
	path := "/host/cgroup" + strings.TrimPrefix(strings.TrimSuffix(n.Cgroup, n.Name), cluster.CgroupFS) + "$(NODE_NAME)"
	return `- target: {kind: DaemonSet, name: kproxy}
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --cgroup=` + path + "\n"
}

func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}
