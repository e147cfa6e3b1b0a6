package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// PauseImage is the pods' sandbox image, under the name the e2e framework
// gives it (test/utils/image/manifest.go).
const PauseImage = "registry.k8s.io/pause:3.10.2"

// nodesUp starts every node (in parallel: their image imports take the
// longest) and waits for each to be Ready.
func (c *Cluster) nodesUp(ctx context.Context) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = c.nodeUp(ctx, n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// kubectl wait finds no node before the kubelets have registered
	// theirs.
	var none *proc
	if err := none.wait(ctx, "the nodes' registration", 2*time.Minute, func() error {
		out, err := c.Kubectl(ctx, "get", "nodes", "-o", "name")
		if err != nil {
			return err
		}
		if n := len(strings.Fields(string(out))); n < len(c.Nodes) {
			return fmt.Errorf("%d of %d nodes registered", n, len(c.Nodes))
		}
		return nil
	}); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "wait", "--for=condition=Ready", "node", "--all", "--timeout=120s")
	return err
}

// nodeUp starts a node's holder, its containerd, imports the images and
// starts its kubelet.
func (c *Cluster) nodeUp(ctx context.Context, n *Node) error {
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	if err := c.startHolder(ctx, n); err != nil {
		return err
	}
	files := map[string]string{
		"containerd.toml":       containerdConfig(n),
		"cni/10-kpe2e.conflist": cniConfig(n),
		"kubelet.yaml":          kubeletConfig(n),
		"resolv.conf":           "options ndots:5\n",
	}
	for name, data := range files {
		p := filepath.Join(n.dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return err
		}
	}
	in := enter{holder: n.holder.cmd.Process.Pid}
	ctrd, err := c.start(n.Name+"-containerd", n.Name, in, []string{"containerd", "--config", filepath.Join(n.dir, "containerd.toml")})
	if err != nil {
		return err
	}
	if err := ctrd.wait(ctx, n.Name+" containerd", time.Minute, func() error {
		return c.NodeCommand(ctx, n, "ctr", "--address", containerdSocket, "version").Run()
	}); err != nil {
		return err
	}
	for _, img := range c.cfg.Images {
		out, err := c.NodeCommand(ctx, n, "ctr", "--address", containerdSocket, "-n", "k8s.io", "images", "import", img).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: import %s: %w: %s", n.Name, img, err, strings.TrimSpace(string(out)))
		}
	}
	c.logf("%s: %d images imported", n.Name, len(c.cfg.Images))
	kc := filepath.Join(n.dir, "kubeconfig")
	if err := c.pki.kubeconfig(kc, "https://"+APIServerIP+":6443"); err != nil {
		return err
	}
	n.kubelet, err = c.start(n.Name+"-kubelet", n.Name, in, []string{c.bin("kubelet"),
		"--config", filepath.Join(n.dir, "kubelet.yaml"), "--kubeconfig", kc,
		"--node-ip", n.IP.String(), "--hostname-override", n.Name, "--v", "1",
	})
	return err
}

// containerdSocket is containerd's socket, in the node's own /run.
const containerdSocket = "/run/containerd/containerd.sock"

// startHolder starts the node's holder in the node's network namespace
// and new mount and UTS namespaces, and waits until it has made its
// mounts.
func (c *Cluster) startHolder(ctx context.Context, n *Node) error {
	argv := []string{"unshare", "--mount", "--uts", "--propagation", "private", "--",
		c.cfg.Self, HolderCommand, n.Name, n.dir}
	p := &proc{name: n.Name + "-holder", log: filepath.Join(c.logDir, n.Name+"-holder.log"), done: make(chan struct{})}
	p.cmd = c.command(n.Name, enter{netns: n.netns}, argv)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	// The holder runs until its standard input closes: at Down, or when
	// this process ends.
	if _, err := p.cmd.StdinPipe(); err != nil {
		return err
	}
	logf, err := os.Create(p.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd.Stderr = logf
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("%s holder: %w", n.Name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	n.holder = p
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		s.Scan()
		line <- s.Text()
		for s.Scan() {
		}
	}()
	select {
	case l := <-line:
		if l != "ready" {
			<-p.done
			return fmt.Errorf("%s holder: %v: %s", n.Name, p.err, tailFile(p.log, 10))
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s holder: not ready after 30s: %s", n.Name, tailFile(p.log, 10))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// containerdConfig is the node's containerd configuration (version 2,
// which containerd 1.6 reads and 2.x migrates): its root in the node's
// /var/lib and its state in the node's /run (both of its own mount
// namespace); runc with cgroupfs; no lowering of oom_score_adj, which
// needs CAP_SYS_RESOURCE, which this machine's root lacks; the CNI
// plugins of Debian's package with the node's configuration.
func containerdConfig(n *Node) string {
	return fmt.Sprintf(`version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, containerdSocket, PauseImage, CNIBinDir, filepath.Join(n.dir, "cni"))
}

// cniConfig gives each pod a veth to the node (ptp) and an address of the
// node's pod CIDR, without masquerade, and hostPort mappings (portmap).
func cniConfig(n *Node) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "kpe2e",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.PodCIDR.String())
}

// kubeletConfig runs kubelet on cgroup v1 (which this machine has; it
// asks for failCgroupV1: false) with its pods' cgroups under the node's
// child cgroup, and without authentication (the API server reaches it
// over the cluster's own bridge only).
func kubeletConfig(n *Node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s/%s
address: %s
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
clusterDNS: [%s]
clusterDomain: %s
resolvConf: %s
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
`, CgroupRoot, n.Name, n.IP, containerdSocket, DNSServiceIP, ClusterDomain, filepath.Join(n.dir, "resolv.conf"))
}
