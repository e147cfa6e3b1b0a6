//go:build linux

// Package netnstest builds throwaway network topologies for tests that
// need a real kernel: a node that runs the code under test, a client
// outside the cluster and backend hosts, each in its own network
// namespace, joined by veth pairs and carrying real TCP, UDP and SCTP
// traffic over IPv4 and IPv6.
//
// # Topology
//
//	 client                node (forwards IPv4, IPv6)          backend-i, i = 0..n-1
//	+--------------+      +------------------------------+      +----------------------+
//	| eth0         |      | ext0   198.51.100.1/24       |      | eth0                 |
//	| 198.51.100.2 +------+        fd00:c::1/64          |      | 10.244.(i+1).2/24    |
//	| fd00:c::2    |      |        (the node IPs)        |      | fd00:244:(i+1)::2/64 |
//	+--------------+      | veth<i> 10.244.(i+1).1/24    +------+                      |
//	                      |        fd00:244:(i+1)::1/64  |      +----------------------+
//	                      +------------------------------+
//
// The client (198.51.100.2/24, fd00:c::2/64) and backend i (0-based;
// 10.244.(i+1).2/24, fd00:244:(i+1)::2/64) have default routes through the
// node, whose addresses on each link end in .1 / ::1. The cluster CIDRs are
// 10.244.0.0/16 and fd00:244::/32 (ClusterCIDRs; not fd00:244::/48, which
// would miss fd00:244:1::/64 and every other backend subnet); the client is
// outside them. The node's links to the backends share the prefix "veth", as a CNI
// plugin's would; its link to the client is "ext0". Every host's link to
// the node is "eth0".
//
// Options.Links reshapes the node's end of chosen backends' links, so that
// tests of interface-based local-traffic detection have pods to find: a
// name of its own (a prefix no other link shares), and a bridge that the
// node's end joins and that holds the node's addresses for the backend,
// as a CNI bridge plugin's pods hang on cbr0 or cni0: the node sees the
// backend's packets come in on the bridge. Backends may share a bridge.
// Where the kernel has br_netfilter, a node with a bridge turns its
// bridge-nf-call sysctls off, so that the bridge's traffic meets the
// node's rules once, at the IP layer, as on a kernel without it.
//
// New(t, Options{Backends: n}) builds it; NewHost(t, name) makes a lone
// namespace with only loopback, for tests of kernel state alone.
//
// Every namespace gets these settings: IPv6 duplicate address detection
// off (and the kit waits until each IPv6 address answers neighbour
// solicitations and every veth is up, so traffic flows as soon as New
// returns), reverse path filtering off, ICMP error rate limits off so
// that every rejected ask sees its ICMP error, and, where the kernel has
// SCTP, SCTP retransmission timers of 50 to 400 ms (initially 200 ms)
// instead of SCTP's 1 to 60 s (initially 3 s), so that an SCTP ask
// recovers from a lost packet within DefaultTimeout. The node forwards
// IPv4 and IPv6. Nothing else is configured: no firewall rules, no conntrack
// settings.
//
// # Working in a namespace
//
// Host.Do runs a function on an OS thread switched into the host's
// namespace: sockets and netlink handles it creates live there. The caller's
// own thread never changes namespace; a thread that cannot be switched back
// is terminated rather than reused. Host.Exec runs a tool (nft, conntrack,
// ip, ...) inside the namespace, forked from such a thread; the namespaces
// are also named under /run/netns, so `ip netns exec <NSName>` reaches them
// while a test is paused. Host.NS is a handle to pass to code under test.
//
// # Traffic
//
// Host.Serve starts an echo server on every address of a host, IPv4 and
// IPv6, for "tcp", "udp" or "sctp"; it answers each request with
// "<host name> <client addr:port>", the client as the server saw it, so a
// test learns which backend answered and whether the source address was
// preserved or masqueraded. UDP answers come from the address the request
// was sent to. Host.Ask makes one fresh connection (or sends one datagram
// from a fresh socket) and parses the reply; its errors tell a refusal (TCP
// reset, SCTP abort, ICMP unreachable of any kind: ErrRefused) from silence
// (ErrTimeout), and AskError.AtSocket tells a connect that failed at once,
// before any packet left. Host.Count makes n asks and counts answers per
// host, and WithinBounds checks such counts against expected shares with a
// bound that a correct random spread fails with probability below 1e-6.
//
// A socket belongs to the cgroup of the process that made it. For code
// that hooks the sockets of a cgroup (a socket-level load balancer),
// StartCgroup starts one process inside a cgroup v2 directory (the test
// binary itself, through clone3 with CLONE_INTO_CGROUP; the package's
// TestMain calls Main), and an ask with InCgroup runs there, from a socket
// made in the asking host's namespace. The process ends with the test.
//
// # Requirements
//
// Require(t, features...) skips a test unless it runs as root on a kernel
// with the named features, each probed for real in a throwaway namespace;
// with CI=true in the environment a missing feature fails the test instead.
// New and NewHost call Require(t) themselves.
//
// # Safety
//
//   - Nothing in the root network namespace changes: no links, addresses,
//     routes, sysctls or firewall rules. Veth pairs are created inside the
//     node's namespace with their peer placed directly in the other test
//     namespace, and settings are written from threads inside the test
//     namespaces.
//   - Traffic flows only between the test namespaces (and their loopback).
//   - Namespaces are named "kpt-<pid>-<token>-<host>" and removed by
//     t.Cleanup. New and NewHost also remove the namespaces of earlier test
//     processes that are no longer running (a crashed run), recognised by
//     the prefix and the pid in the name; namespaces of running processes
//     and foreign namespaces are never touched.
//   - /run/netns is made a shared mount point on first use, exactly as
//     `ip netns add` does, so that iproute2 and the kit agree on it.
//   - Echo servers are goroutines of the test process, stopped on cleanup;
//     the kit starts no other process than the tools Exec runs and the
//     asker of StartCgroup, which it ends by its pid, and which dies with
//     the test process (PR_SET_PDEATHSIG).
package netnstest
