package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Config says what cluster to start and with which programs.
type Config struct {
	// Dir holds the cluster's files while it runs (certificates, the
	// etcd data, each node's runtime root and logs); it is removed by
	// Down. Default DefaultDir.
	Dir string
	// Nodes is the number of worker nodes, 1 to 9; default 3.
	Nodes int
	// Bin holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet and kubectl. etcd, containerd, runc and the CNI plugins are
	// Debian's, found on the PATH and in CNIBinDir.
	Bin string
	// CoreDNS is the coredns binary; without it the cluster has no DNS
	// (the service kube-system/kube-dns is not made).
	CoreDNS string
	// Images are OCI image archives imported into each node's runtime.
	Images []string
	// Self is the harness's own binary, which runs the nodes' holders
	// (HolderCommand); default os.Executable.
	Self string
	// Log receives a line per step; nil discards.
	Log io.Writer
}

// DefaultDir is where a cluster keeps its files.
const DefaultDir = "/var/tmp/kproxy-e2e"

// CNIBinDir holds Debian's CNI plugins (package containernetworking-plugins).
const CNIBinDir = "/usr/lib/cni"

// Cluster is a running cluster: a control plane and Nodes, each in
// network namespaces of its own (see net.go), its processes in child
// cgroups of CgroupRoot.
type Cluster struct {
	// Kubeconfig reaches the API server as a member of system:masters,
	// from the control plane's network namespace (Command).
	Kubeconfig string
	// Nodes are the worker nodes.
	Nodes []*Node

	cfg     Config
	pki     *pki
	logDir  string
	hier    []string
	procs   []*proc
	unlock  func()
	started time.Time
}

// Node is a worker node.
type Node struct {
	// Name is the Node's name and hostname, such as e2e-node1.
	Name string
	// IP is its address; PodCIDR its pods' addresses.
	IP      netip.Addr
	PodCIDR netip.Prefix
	// Cgroup is the directory, in the host's cgroup v2 hierarchy, of the
	// cgroup every process of the node and of its pods is in.
	Cgroup string

	dir     string
	netns   string
	holder  *proc
	kubelet *proc
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Log != nil {
		fmt.Fprintf(c.cfg.Log, "cluster: %s: %s\n", time.Since(c.started).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
	}
}

// Up reaps what a crashed run left, then starts a cluster and returns it
// once every node is Ready. Only one cluster runs on a machine at a time:
// Up waits for one that runs to end. On error nothing is left behind.
func Up(ctx context.Context, cfg Config) (c *Cluster, err error) {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Nodes < 1 || cfg.Nodes > 9 {
		return nil, fmt.Errorf("cluster: %d nodes: want 1 to 9", cfg.Nodes)
	}
	if cfg.Self == "" {
		if cfg.Self, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	unlock, err := lockRun(cfg.Dir, true)
	if err != nil {
		return nil, err
	}
	c = &Cluster{cfg: cfg, unlock: unlock, started: time.Now()}
	defer func() {
		if err != nil {
			c.Down()
			c = nil
		}
	}()
	if err := reap(ctx, cfg.Dir); err != nil {
		return c, fmt.Errorf("cluster: reap an earlier run: %w", err)
	}
	if c.hier, err = hierarchies(); err != nil {
		return c, err
	}
	uni := unified(c.hier)
	if uni == "" {
		return c, errors.New("cluster: the host mounts no cgroup v2 hierarchy under " + CgroupFS)
	}
	c.logDir = filepath.Join(cfg.Dir, "logs")
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return c, err
	}
	for i := 1; i <= cfg.Nodes; i++ {
		addr, pods := nodeAddrs(i)
		name := fmt.Sprintf("e2e-node%d", i)
		c.Nodes = append(c.Nodes, &Node{
			Name: name, IP: addr, PodCIDR: pods, Cgroup: filepath.Join(uni, CgroupRoot, name),
			dir: filepath.Join(cfg.Dir, name), netns: NetNSPrefix + name,
		})
	}
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"network", c.netUp},
		{"cgroups", c.cgroupsUp},
		{"certificates", c.pkiUp},
		{"control plane", c.controlPlaneUp},
		{"nodes", c.nodesUp},
	}
	if cfg.CoreDNS != "" {
		steps = append(steps, struct {
			name string
			f    func(context.Context) error
		}{"cluster DNS", c.dnsUp})
	}
	for _, s := range steps {
		if err := s.f(ctx); err != nil {
			return c, fmt.Errorf("cluster: %s: %w", s.name, err)
		}
		c.logf("%s up", s.name)
	}
	return c, nil
}

func (c *Cluster) cgroupsUp(context.Context) error {
	if err := makeCgroup(c.hier, controlPlane); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := makeCgroup(c.hier, n.Name); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) pkiUp(context.Context) error {
	ips := []net.IP{net.ParseIP(APIServerIP), net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")}
	names := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDomain}
	var err error
	if c.pki, err = writePKI(filepath.Join(c.cfg.Dir, "pki"), ips, names); err != nil {
		return err
	}
	c.Kubeconfig = filepath.Join(c.cfg.Dir, "kubeconfig")
	return c.pki.kubeconfig(c.Kubeconfig, "https://"+APIServerIP+":6443")
}

// Command returns a command that runs in the control plane's network
// namespace, as the tests do: it reaches the API server, the nodes, the
// pods and their services' node ports, and nothing else.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + nsPath(cpNS), "--", name}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	return cmd
}

// NodeCommand returns a command that runs on a node: in its network,
// mount and UTS namespaces, as its kubelet does.
func (c *Cluster) NodeCommand(ctx context.Context, n *Node, name string, args ...string) *exec.Cmd {
	e := enter{holder: n.holder.cmd.Process.Pid}
	return exec.CommandContext(ctx, e.args()[0], append(append(e.args()[1:], name), args...)...)
}

// Kubectl runs kubectl against the cluster and returns its output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	cmd := c.Command(ctx, filepath.Join(c.cfg.Bin, "kubectl"), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// KubectlPath is the path of the kubectl binary the cluster was started
// with.
func (c *Cluster) KubectlPath() string { return filepath.Join(c.cfg.Bin, "kubectl") }

// Logs is the directory of the cluster's processes' logs (and, under
// each node's var-log, its pods' logs); Down removes it.
func (c *Cluster) Logs() string { return c.logDir }

// PodLogs is the directory of a node's pods' logs, as kubelet writes
// them (<namespace>_<pod>_<uid>/<container>/<n>.log).
func (n *Node) PodLogs() string { return filepath.Join(n.dir, "var-log", "pods") }

// Down ends every process of the cluster by its pid (and the pods',
// through the cgroups they are in), deletes its namespaces and cgroups,
// removes its files and releases the machine for the next cluster.
func (c *Cluster) Down() error {
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The kubelets first, so that they restart nothing, then everything
	// else, the holders last.
	for _, n := range c.Nodes {
		if n.kubelet != nil {
			n.kubelet.stop(10 * time.Second)
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(5 * time.Second)
	}
	err := reap(ctx, c.cfg.Dir)
	if c.unlock != nil {
		c.unlock()
	}
	c.logf("down")
	return err
}

// Reap removes what a cluster that was not brought down left behind
// (its processes, namespaces, cgroups and files). It fails while a
// cluster runs.
func Reap(ctx context.Context, dir string) error {
	if dir == "" {
		dir = DefaultDir
	}
	unlock, err := lockRun(dir, false)
	if err != nil {
		return err
	}
	defer unlock()
	return reap(ctx, dir)
}

// reap ends the processes in the cluster's cgroups, deletes its
// namespaces and cgroups, and removes dir. Every process in those cgroups
// is one the cluster started (or its kubelets and runtimes did); the
// namespaces are recognised by NetNSPrefix.
func reap(ctx context.Context, dir string) error {
	hier, err := hierarchies()
	if err != nil {
		return err
	}
	errs := []error{killCgroups(hier), netDown(ctx)}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// lockRun takes the machine's cluster lock, a file beside dir: waiting
// for it, or failing when it is held.
func lockRun(dir string, wait bool) (func(), error) {
	path := strings.TrimSuffix(dir, "/") + ".lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if !wait {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("a cluster runs (%s is locked)", path)
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
