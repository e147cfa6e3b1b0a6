// Package cluster starts a Kubernetes cluster on one Linux machine, for
// the real-cluster tests: a control plane (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and CoreDNS) and worker nodes,
// each node a containerd with runc and the CNI ptp plugin, and a kubelet,
// all from binaries built from source or Debian's packages.
//
// Nothing of the machine's own changes:
//
//   - the control plane and each node live in a network namespace of
//     their own, joined by a bridge in a third (see net.go); no link,
//     address, route, firewall rule or sysctl of the root namespace is
//     touched, and nothing leaves the cluster's namespaces: the control
//     plane has no default route and does not forward;
//   - each node's processes also have a mount namespace and a UTS
//     namespace of their own (their holder makes them, see Hold), so that
//     their mounts, their hostname and the sysctls kubelet wants are
//     theirs alone;
//   - every process is started into child cgroups of CgroupRoot, in each
//     of the host's hierarchies; kubelet puts its pods under its node's.
//     The node's cgroup in the cgroup v2 hierarchy (Node.Cgroup) is where
//     a socket-level load balancer attaches to see the node's sockets and
//     its pods';
//   - the files are under Config.Dir.
//
// Down ends every process by its pid, the pods' through their cgroups,
// and removes the namespaces, the cgroups and the files. Up first reaps
// what a run that was not brought down left (Reap does only that); one
// cluster runs on a machine at a time.
//
// It needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN, a kernel with network
// namespaces, veth, bridge and overlayfs, cgroup v1 hierarchies (kubelet
// runs on them, with failCgroupV1: false) and a cgroup v2 one.
package cluster
