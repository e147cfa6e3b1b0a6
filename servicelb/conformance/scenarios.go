//go:build linux

package conformance

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Scenarios returns the scenario table, in the order Run runs it. Each
// scenario's position gives it its own addresses: new scenarios go at the
// end of their group's list below without renumbering the others' meaning.
func Scenarios() []Scenario {
	return slices.Concat(clusterIPScenarios(), internalPolicyScenarios(), nodePortScenarios(),
		externalIPScenarios(), loadBalancerScenarios(), sourceRangeScenarios(), affinityScenarios(),
		hairpinScenarios(), topologyScenarios(), staleFlowScenarios(), conflictScenarios(), schedulerScenarios(),
		detectLocalScenarios(), loadScenarios())
}

// NoSCTPChecks names the scenarios with a stage whose checks are all of
// TCP or UDP (an even spread measured over TCP, UDP sessions, affinity
// timed over TCP): a run over SCTP alone leaves them out, and its
// Options.NotApplicable lists them.
func NoSCTPChecks() []string {
	return []string{
		"cluster-ip/even-shares", "cluster-ip/weights", "cluster-ip/only-named-ports",
		"affinity/per-client", "affinity/lasts-while-renewed-then-expires",
		"stale-flows/endpoint-removed", "stale-flows/serving-terminating-endpoint-keeps-its-flows",
		"stale-flows/drained-endpoint-keeps-its-flows", "stale-flows/deselected-by-policy-keeps-its-flows",
		"stale-flows/restart-reconciles-the-table", "stale-flows/target-port-changed",
		"stale-flows/no-serving-endpoint-keeps-its-flows", "stale-flows/deleted-service-keeps-its-flows",
		"stale-flows/node-and-pod-sockets-keep-their-endpoint", "scheduler/maglev-spreads-one-clients-connections", "load/flood-leaves-other-services",
	}
}

// c builds a check.
func c(from From, to Target, want Outcome) Check { return Check{From: from, To: to, Want: want} }

// every builds the same check from each origin.
func every(to Target, want Outcome) []Check {
	return []Check{c(Outside, to, want), c(Pod, to, want), c(Node, to, want)}
}

// one is a scenario of one stage.
func one(name, follows string, services func(*Env) []servicelb.Service, checks ...Check) Scenario {
	return Scenario{Name: name, Follows: follows, Stages: []Stage{{Services: services, Expect: checks}}}
}

func oneNode(name, follows string, node func(*servicelb.NodeConfig, *Env), services func(*Env) []servicelb.Service, checks ...Check) Scenario {
	return Scenario{Name: name, Follows: follows, Stages: []Stage{{Node: node, Services: services, Expect: checks}}}
}

func needs(f servicelb.Features, sc Scenario) Scenario { sc.Needs |= f; return sc }

func eps(f func() []servicelb.Endpoint) func() []servicelb.Endpoint { return f }

const (
	followSVC        = "iptables (*Proxier).syncProxyRules: KUBE-SVC chain, statistic random spread, masquerade of traffic from outside the cluster CIDRs (localDetector.IfNotLocal)"
	followReject     = "iptables (*Proxier).syncProxyRules: REJECT (icmp-port-unreachable) when !hasAnyEndpoints, DROP when the policy leaves none"
	followCategorize = "proxy.CategorizeEndpoints: ready endpoints, else serving terminating ones, per set"
	followEXT        = "iptables (*Proxier).syncProxyRules: KUBE-EXT chain, pod and LOCAL short-circuit to the cluster policy chain under externalTrafficPolicy Local"
	followFW         = "iptables (*Proxier).syncProxyRules: KUBE-FW chain, loadBalancerSourceRanges with allowFromNode; proxy.newBaseServiceInfo filters the ranges by family"
	followAffinity   = "iptables (*Proxier).syncProxyRules: -m recent --rcheck --seconds --reap in KUBE-SVC, --set in KUBE-SEP"
	followHairpin    = "iptables (*Proxier).syncProxyRules: KUBE-SEP chain, -s endpoint -j KUBE-MARK-MASQ"
	followTopology   = "proxy.CategorizeEndpoints and topologyModeFromHints"
	followStale      = "conntrack.CleanStaleEntries"
	followDuplicates = "proxy (*EndpointSliceCache).addEndpoints: one endpoint per address and port, the first kept unless a later one is local"
	followClusterIPs = "nftables (*Proxier).setupNFTables: cluster-ips-check, reject to undefined ports of cluster IPs, drop to unallocated service CIDR addresses"
)

func clusterIPScenarios() []Scenario {
	all := func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }
	return []Scenario{
		one("cluster-ip/spread-and-masquerade", followSVC, One(all),
			c(Outside, ClusterIP, Reach(0, 1, 2).Spread().Masqueraded()),
			c(Pod, ClusterIP, Reach(0, 1, 2).Spread().Preserved()),
			c(Node, ClusterIP, Reach(0, 1, 2).Spread().Masqueraded())),
		one("cluster-ip/even-shares", followSVC, One(all),
			Check{From: Outside, To: ClusterIP, Proto: servicelb.TCP, Want: Reach(0, 1, 2).Shares(map[int]float64{0: 1, 1: 1, 2: 1})}),
		needs(servicelb.FeatureWeights, one("cluster-ip/weights", "kproxy's own: endpoint weights (kube-proxy spreads evenly)",
			One(func() []servicelb.Endpoint {
				return Join(Weighted(1, RemoteEps(0)), Weighted(2, RemoteEps(1)), Weighted(3, RemoteEps(2)))
			}),
			Check{From: Outside, To: ClusterIP, Proto: servicelb.TCP, Want: Reach(0, 1, 2).Shares(map[int]float64{0: 1, 1: 2, 2: 3})})),
		one("cluster-ip/weight-zero-drains", "kproxy's own: weight 0 takes no new flows", One(func() []servicelb.Endpoint {
			return Join(Weighted(0, RemoteEps(0)), RemoteEps(1, 2))
		}), c(Outside, ClusterIP, Reach(1, 2).Spread())),
		one("cluster-ip/all-drained-rejects", followReject, One(func() []servicelb.Endpoint { return Weighted(0, RemoteEps(0, 1)) }),
			every(ClusterIP, Refused())...),
		one("cluster-ip/no-endpoints-rejects", followReject, One(func() []servicelb.Endpoint { return nil }),
			every(ClusterIP, Refused())...),
		one("cluster-ip/not-serving-rejects", followReject, One(func() []servicelb.Endpoint { return NotServing(RemoteEps(0, 1)) }),
			c(Outside, ClusterIP, Refused())),
		one("cluster-ip/terminating-fallback", followCategorize, One(func() []servicelb.Endpoint {
			return Join(Terminating(RemoteEps(0)), NotServing(RemoteEps(1)))
		}), every(ClusterIP, Reach(0))...),
		one("cluster-ip/terminating-ignored-while-one-is-ready", followCategorize, One(func() []servicelb.Endpoint {
			return Join(Terminating(RemoteEps(0)), RemoteEps(1))
		}), c(Outside, ClusterIP, Reach(1))),
		oneNode("cluster-ip/no-cluster-cidrs-no-masquerade", "iptables (*Proxier).syncProxyRules: no masquerade rule without a local-traffic detector",
			func(n *servicelb.NodeConfig, _ *Env) { n.ClusterCIDRs = nil }, One(all),
			c(Outside, ClusterIP, Reach(0, 1, 2).Preserved()),
			c(Node, ClusterIP, Reach(0, 1, 2).Preserved())),
		oneNode("cluster-ip/masquerade-all", "iptables (*Proxier).syncProxyRules: masqueradeAll marks all traffic to cluster IPs",
			func(n *servicelb.NodeConfig, _ *Env) { n.MasqueradeAll = true }, One(all),
			c(Pod, ClusterIP, Reach(0, 1, 2).Masqueraded()),
			c(Outside, ClusterIP, Reach(0, 1, 2).Masqueraded())),
		one("cluster-ip/target-ports", "proxy endpoint ports from the EndpointSlice's named ports", func(e *Env) []servicelb.Service {
			s := e.Service(0, Join(RemoteEps(0), RemoteEps(1)))
			for i := range s.Ports {
				s.Ports[i].TargetPort = 9 // nothing listens there
			}
			for i := range s.Endpoints {
				port := uint16(TargetPort)
				if i >= 2 {
					port = AltTargetPort
				}
				s.Endpoints[i].Ports = map[string]uint16{}
				for _, p := range s.Ports {
					s.Endpoints[i].Ports[p.Name] = port
				}
			}
			return []servicelb.Service{s}
		}, c(Outside, ClusterIP, Reach(0, 1).Spread())),
		one("cluster-ip/only-named-ports", "proxy: an EndpointSlice's endpoints serve only the slice's ports", func(e *Env) []servicelb.Service {
			s := e.Service(0, Join(RemoteEps(0), RemoteEps(1)))
			for i := range s.Endpoints[:2] {
				s.Endpoints[i].Ports = map[string]uint16{"tcp": TargetPort}
				s.Endpoints[i].OnlyNamedPorts = true
			}
			return []servicelb.Service{s}
		},
			Check{From: Outside, To: ClusterIP, Proto: servicelb.TCP, Want: Reach(0, 1).Spread()},
			Check{From: Outside, To: ClusterIP, Proto: servicelb.UDP, Want: Reach(1)}),
		// Endpoint 0 is listed remote, then local: the local one stays, and
		// takes outside traffic under the external Local policy. Endpoint
		// 2 is listed not serving, then ready: the first stays, and 2
		// takes no traffic.
		one("cluster-ip/duplicate-endpoints", followDuplicates, One(func() []servicelb.Endpoint {
			return Join(RemoteEps(0), Local(0), RemoteEps(1), NotServing(RemoteEps(2)), RemoteEps(2))
		}, WithNodePort(), ExternalLocal()),
			c(Outside, ClusterIP, Reach(0, 1).Spread()),
			c(Outside, NodePort, Reach(0).Preserved())),
		needs(servicelb.FeatureUndefinedPorts, one("cluster-ip/undefined-port-rejected", followClusterIPs, One(all),
			c(Outside, ClusterIP.OnPort(81), Refused()), c(Node, ClusterIP.OnPort(81), Refused()),
			c(Outside, ClusterIP, Reach(0, 1, 2)))),
		needs(servicelb.FeatureServiceCIDRs|servicelb.FeatureUndefinedPorts, oneNode("cluster-ip/unallocated-service-address-dropped", followClusterIPs,
			func(n *servicelb.NodeConfig, e *Env) { n.ServiceCIDRs = e.ServiceCIDRs() }, One(all),
			c(Outside, Unallocated, Dropped()), c(Pod, Unallocated, Dropped()),
			c(Outside, ClusterIP.OnPort(81), Refused()), c(Outside, ClusterIP, Reach(0, 1, 2)))),
		{Name: "cluster-ip/endpoint-changes", Follows: "proxy change tracking and partial syncs", Stages: []Stage{
			{Services: One(eps(func() []servicelb.Endpoint { return RemoteEps(0) })), Expect: []Check{c(Outside, ClusterIP, Reach(0))}},
			{Services: One(eps(func() []servicelb.Endpoint { return RemoteEps(1, 2) })), Expect: []Check{c(Outside, ClusterIP, Reach(1, 2).Spread())}},
			{Services: One(eps(func() []servicelb.Endpoint { return nil })), Expect: []Check{c(Outside, ClusterIP, Refused())}},
			{Services: One(eps(func() []servicelb.Endpoint { return RemoteEps(0) })), Expect: []Check{c(Outside, ClusterIP, Reach(0))}},
			{Services: func(*Env) []servicelb.Service { return nil }},
		}},
		one("cluster-ip/ipv6-only", "proxy: single-stack services", One(all, OnlyFamily(servicelb.IPv6)),
			Check{From: Outside, To: ClusterIP, Families: []servicelb.Family{servicelb.IPv6}, Want: Reach(0, 1, 2).Masqueraded()}),
	}
}

func internalPolicyScenarios() []Scenario {
	return []Scenario{
		one("internal-local/local-endpoint", "proxy.CategorizeEndpoints: internalTrafficPolicy Local uses the local endpoints, from every origin",
			One(func() []servicelb.Endpoint { return Join(Local(0), RemoteEps(1, 2)) }, InternalLocal()),
			every(ClusterIP, Reach(0))...),
		one("internal-local/no-local-endpoint-drops", followReject+" (\"has no local endpoints\")",
			One(func() []servicelb.Endpoint { return RemoteEps(1, 2) }, InternalLocal()),
			every(ClusterIP, Dropped())...),
		one("internal-local/terminating-local-fallback", followCategorize,
			One(func() []servicelb.Endpoint { return Join(Terminating(Local(0)), RemoteEps(1)) }, InternalLocal()),
			c(Outside, ClusterIP, Reach(0)), c(Pod, ClusterIP, Reach(0))),
	}
}

func nodePortScenarios() []Scenario {
	return []Scenario{
		one("node-port/cluster-policy", "iptables (*Proxier).syncProxyRules: KUBE-NODEPORTS, KUBE-EXT masquerades under externalTrafficPolicy Cluster",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, WithNodePort()),
			c(Outside, NodePort, Reach(0, 1, 2).Spread().Masqueraded()),
			c(Pod, NodePort, Reach(0, 1, 2).Masqueraded()),
			c(Node, NodePort, Reach(0, 1, 2).Masqueraded())),
		one("node-port/no-endpoints-rejects", followReject, One(func() []servicelb.Endpoint { return nil }, WithNodePort()),
			every(NodePort, Refused())...),
		one("node-port/local-policy-local-endpoint", followEXT,
			One(func() []servicelb.Endpoint { return Join(Local(0), RemoteEps(1, 2)) }, WithNodePort(), ExternalLocal()),
			c(Outside, NodePort, Reach(0).Preserved()),
			c(Pod, NodePort, Reach(0, 1, 2).Spread().Preserved()),
			c(Node, NodePort, Reach(0, 1, 2).Spread().Masqueraded())),
		one("node-port/local-policy-no-local-endpoint", followEXT+"; "+followReject,
			One(func() []servicelb.Endpoint { return RemoteEps(1, 2) }, WithNodePort(), ExternalLocal()),
			c(Outside, NodePort, Dropped()),
			c(Pod, NodePort, Reach(1, 2).Spread().Preserved()),
			c(Node, NodePort, Reach(1, 2).Masqueraded())),
		oneNode("node-port/local-policy-without-cluster-cidrs", followEXT+" (only with a local-traffic detector)",
			func(n *servicelb.NodeConfig, _ *Env) { n.ClusterCIDRs = nil },
			One(func() []servicelb.Endpoint { return RemoteEps(1, 2) }, WithNodePort(), ExternalLocal()),
			c(Outside, NodePort, Dropped()), c(Pod, NodePort, Dropped()), c(Node, NodePort, Reach(1, 2).Masqueraded())),
		one("node-port/both-policies-local-remote-endpoints-only", followEXT+"; proxy (*BaseServicePortInfo).UsesClusterEndpoints",
			One(func() []servicelb.Endpoint { return RemoteEps(1, 2) }, WithNodePort(), ExternalLocal(), InternalLocal()),
			c(Outside, ClusterIP, Dropped()), c(Pod, ClusterIP, Dropped()), c(Node, ClusterIP, Dropped()),
			c(Outside, NodePort, Dropped()),
			c(Pod, NodePort, Reach(1, 2).Preserved()),
			c(Node, NodePort, Reach(1, 2).Masqueraded())),
		one("node-port/local-policy-terminating-fallback", followCategorize,
			One(func() []servicelb.Endpoint { return Join(Terminating(Local(0)), RemoteEps(1)) }, WithNodePort(), ExternalLocal()),
			c(Outside, NodePort, Reach(0).Preserved())),
		oneNode("node-port/masquerade-all-keeps-local-source", "iptables (*Proxier).syncProxyRules: masqueradeAll applies to cluster IPs only",
			func(n *servicelb.NodeConfig, _ *Env) { n.MasqueradeAll = true },
			One(func() []servicelb.Endpoint { return Local(0) }, WithNodePort(), ExternalLocal()),
			c(Outside, NodePort, Reach(0).Preserved())),
		one("node-port/hairpin", followHairpin, One(func() []servicelb.Endpoint { return RemoteEps(1) }, WithNodePort()),
			c(Endpoint(1), NodePort, Reach(1).Masqueraded())),
		nodePortAddresses("node-port/every-local-address", followNodePortAddresses+" (no nodePortAddresses: every local address)",
			func(*servicelb.NodeConfig, *Env) {},
			c(Outside, LocalNodePort, Reach(0, 1)), c(Outside, NodePort, Reach(0, 1))),
		nodePortAddresses("node-port/cidrs-select-addresses", followNodePortAddresses,
			func(n *servicelb.NodeConfig, e *Env) {
				n.NodePortAddresses = []netip.Prefix{hostPrefix(e.LocalIP(servicelb.IPv4)), hostPrefix(e.LocalIP(servicelb.IPv6))}
			},
			// A node port not served leaves the packet to the node's own
			// stack: no UDP socket, an ICMP port unreachable.
			c(Outside, LocalNodePort, Reach(0, 1)), Check{From: Outside, To: NodePort, Proto: servicelb.UDP, Want: Refused()}),
		nodePortAddresses("node-port/primary-keyword", followNodePortAddresses+" (the \"primary\" keyword: the node's IPs)",
			func(n *servicelb.NodeConfig, _ *Env) { n.NodePortPrimary = true },
			c(Outside, NodePort, Reach(0, 1)), Check{From: Outside, To: LocalNodePort, Proto: servicelb.UDP, Want: Refused()}),
		needs(servicelb.FeatureLocalhostNodePorts, oneNode("node-port/localhost",
			"iptables (*Proxier).syncProxyRules: localhostNodePorts, KUBE-NODEPORTS for 127.0.0.1 with route_localnet and the localnet firewall",
			func(n *servicelb.NodeConfig, _ *Env) { n.LocalhostNodePorts = true },
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithNodePort()),
			Check{From: Node, To: LocalhostNodePort, Families: []servicelb.Family{servicelb.IPv4}, Want: Reach(0, 1).Masqueraded()},
			c(Outside, NodePort, Reach(0, 1)))),
		addressAdded(),
		{Name: "node-port/health-check-node-port", Follows: "iptables (*Proxier).syncProxyRules: KUBE-NODEPORTS in the filter table accepts each " +
			"healthCheckNodePort (\"health check node port\"), from INPUT; healthcheck.ServiceHealthServer listens on it",
			Stages: []Stage{{
				Before: serveHealthCheckNodePort,
				Services: One(func() []servicelb.Endpoint { return Join(Local(0), RemoteEps(1)) },
					WithNodePort(), ExternalLocal(), WithHealthCheckNodePort()),
				Expect: []Check{
					{Proto: servicelb.TCP, Custom: healthCheckNodePortAnswers},
					c(Outside, NodePort, Reach(0).Preserved()),
				},
			}}},
		needs(servicelb.FeatureFreePorts, one("node-port/ports-stay-free",
			"kube-proxy's kernel rules take no socket: a host-network server binds the wildcard address on any port",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithNodePort()),
			Check{Custom: portsStayFree},
			c(Outside, ClusterIP, Reach(0, 1)), c(Outside, NodePort, Reach(0, 1)))),
	}
}

// portsStayFree: a process of the node binds the wildcard address on the
// service's port and on its node port, as a host-network server does,
// while the service is served.
func portsStayFree(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
	t.Helper()
	wildcard := netip.IPv4Unspecified()
	if f == servicelb.IPv6 {
		wildcard = netip.IPv6Unspecified()
	}
	for _, port := range []uint16{ServicePort, e.NodePortOf(0)} {
		at := netip.AddrPortFrom(wildcard, port)
		if err := e.NodeHost().Do(func() error { return bindServer(p, at) }); err != nil {
			t.Errorf("%s %s: a server of the node binds %s: %v, want the port free", f, p.Lower(), at, err)
		}
	}
}

// bindServer binds a socket of protocol p at as a server does (a stream
// socket with SO_REUSEADDR, listening; IPv6 only on an IPv6 address), and
// closes it.
func bindServer(p servicelb.Protocol, at netip.AddrPort) error {
	var domain int
	var sa syscall.Sockaddr
	if at.Addr().Is4() {
		domain, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: int(at.Port()), Addr: at.Addr().As4()}
	} else {
		domain, sa = syscall.AF_INET6, &syscall.SockaddrInet6{Port: int(at.Port()), Addr: at.Addr().As16()}
	}
	typ, proto := syscall.SOCK_STREAM, syscall.IPPROTO_TCP
	switch p {
	case servicelb.UDP:
		typ, proto = syscall.SOCK_DGRAM, syscall.IPPROTO_UDP
	case servicelb.SCTP:
		proto = syscall.IPPROTO_SCTP
	}
	fd, err := syscall.Socket(domain, typ|syscall.SOCK_CLOEXEC, proto)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if domain == syscall.AF_INET6 {
		if err := syscall.SetsockoptInt(fd, syscall.IPPROTO_IPV6, syscall.IPV6_V6ONLY, 1); err != nil {
			return err
		}
	}
	if typ == syscall.SOCK_STREAM {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return err
		}
	}
	if err := syscall.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	if typ == syscall.SOCK_STREAM {
		return syscall.Listen(fd, 1)
	}
	return nil
}

// addressAdded is the scenario of an address added to the node while the
// proxier runs, as package nodeaddr reports it to an agent, which hands
// the Runner a node with the address among its LocalIPs.
func addressAdded() Scenario {
	services := One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithNodePort())
	return Scenario{Name: "node-port/address-added-while-running", Follows: followNodePortAddresses +
		", again at every sync: an address added to an interface serves node ports from the next sync on, with no restart",
		Stages: []Stage{
			{
				// The address is on the node, but not yet in its config:
				// its node port is the node's own stack's, which has no
				// UDP socket there.
				Before:   AddLocalIP,
				Services: services,
				Expect: []Check{c(Outside, NodePort, Reach(0, 1)),
					{From: Outside, To: LocalNodePort, Proto: servicelb.UDP, Want: Refused()}},
			},
			{
				Node: func(n *servicelb.NodeConfig, e *Env) {
					n.LocalIPs = []netip.Addr{e.LocalIP(servicelb.IPv4), e.LocalIP(servicelb.IPv6)}
				},
				Services: services,
				Expect:   []Check{c(Outside, LocalNodePort, Reach(0, 1)), c(Outside, NodePort, Reach(0, 1))},
			},
		}}
}

// serveHealthCheckNodePort serves TCP echo on the node itself on the
// scenario's health check node port, as an agent serves the port's
// health check (package healthcheck) beside the proxier.
func serveHealthCheckNodePort(t *testing.T, e *Env) {
	e.NodeHost().Serve(t, "tcp", e.HealthCheckNodePortOf(0))
}

// healthCheckNodePortAnswers checks that the outside client, a load
// balancer's prober, reaches the node's own server on the health check
// node port through the proxier's rules.
func healthCheckNodePortAnswers(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
	t.Helper()
	r, err := e.Ask(t, Outside, HealthCheckNodePort, f, p)
	if err != nil {
		t.Errorf("%s %s from outside to the health check node port %s: %v, want the node's own server to answer",
			f, p.Lower(), e.resolve(HealthCheckNodePort, f, p), err)
		return
	}
	if r.Host != e.NodeHost().Name {
		t.Errorf("%s %s from outside to the health check node port: answered by %s, want the node's own server", f, p.Lower(), r.Host)
	}
}

const followNodePortAddresses = "proxy/util NodePortAddresses.GetNodeIPs: node ports on the local addresses nodePortAddresses selects"

// nodePortAddresses is a scenario of a service with a node port on a node
// with another local address (Env.LocalIP), whose node config node edits.
func nodePortAddresses(name, follows string, node func(*servicelb.NodeConfig, *Env), checks ...Check) Scenario {
	return Scenario{Name: name, Follows: follows, Stages: []Stage{{
		Before: AddLocalIP,
		Node: func(n *servicelb.NodeConfig, e *Env) {
			n.LocalIPs = []netip.Addr{e.LocalIP(servicelb.IPv4), e.LocalIP(servicelb.IPv6)}
			node(n, e)
		},
		Services: One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithNodePort()),
		Expect:   checks,
	}}}
}

func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

func externalIPScenarios() []Scenario {
	return []Scenario{
		one("external-ip/cluster-policy", "iptables (*Proxier).syncProxyRules: external IPs through KUBE-EXT",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, WithExternalIP()),
			c(Outside, ExternalIP, Reach(0, 1, 2).Spread().Masqueraded()),
			c(Pod, ExternalIP, Reach(0, 1, 2).Masqueraded()),
			c(Node, ExternalIP, Reach(0, 1, 2).Masqueraded())),
		one("external-ip/local-policy", followEXT,
			One(func() []servicelb.Endpoint { return Join(Local(0), RemoteEps(1)) }, WithExternalIP(), ExternalLocal()),
			c(Outside, ExternalIP, Reach(0).Preserved()),
			c(Pod, ExternalIP, Reach(0, 1).Spread().Preserved()),
			c(Node, ExternalIP, Reach(0, 1).Masqueraded())),
		one("external-ip/local-policy-no-local-endpoint", followEXT,
			One(func() []servicelb.Endpoint { return RemoteEps(1) }, WithExternalIP(), ExternalLocal()),
			c(Outside, ExternalIP, Dropped()), c(Pod, ExternalIP, Reach(1).Preserved()), c(Node, ExternalIP, Reach(1).Masqueraded())),
		one("external-ip/no-endpoints-rejects", followReject, One(func() []servicelb.Endpoint { return nil }, WithExternalIP()),
			every(ExternalIP, Refused())...),
		needs(servicelb.FeatureNoARPAnswers, one("external-ip/no-arp-answers",
			"kube-proxy's iptables and nftables modes hold no service address; its IPVS mode with --ipvs-strict-arp (arp_ignore=1, arp_announce=2)",
			One(func() []servicelb.Endpoint { return RemoteEps(0) }, WithExternalIP(), WithLoadBalancerIP()),
			Check{Custom: noARPAnswers},
			c(Outside, ExternalIP, Reach(0)), c(Outside, LoadBalancerIP, Reach(0)))),
	}
}

// noARPAnswers: the outside client, a neighbour on the node's link, asks
// who has the service's cluster, external and load-balancer IPs, as a
// router or a load-balancer announcer would, and nobody answers. It asks
// for the node's own address on the link alike, which must be answered,
// so that the silence is the node's and not the probe's. The neighbour
// table knows no protocol: the check runs once per family.
func noARPAnswers(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
	t.Helper()
	if p != e.Protocols()[0] {
		return
	}
	service := []netip.Addr{e.ClusterIP(f, 0), e.ExternalIP(f, 0), e.LoadBalancerIP(f, 0)}
	got, err := e.lab.tp.Client.Resolve(t.Context(), append([]netip.Addr{e.NodeIP(f)}, service...), 2*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	if got[e.NodeIP(f)] == nil {
		t.Fatalf("%s: no answer for the node's own address %s either: the probe cannot tell", f, e.NodeIP(f))
	}
	for _, a := range service {
		if mac := got[a]; mac != nil {
			t.Errorf("%s: %s was answered for with %s (the node's is %s), want no answer", f, a, mac, got[e.NodeIP(f)])
		}
	}
}

func loadBalancerScenarios() []Scenario {
	return []Scenario{
		one("load-balancer/cluster-policy", "iptables (*Proxier).syncProxyRules: load-balancer IPs through KUBE-EXT",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, WithLoadBalancerIP()),
			c(Outside, LoadBalancerIP, Reach(0, 1, 2).Spread().Masqueraded()),
			c(Pod, LoadBalancerIP, Reach(0, 1, 2).Masqueraded()),
			c(Node, LoadBalancerIP, Reach(0, 1, 2).Masqueraded())),
		one("load-balancer/local-policy", followEXT,
			One(func() []servicelb.Endpoint { return Join(Local(0), RemoteEps(1)) }, WithLoadBalancerIP(), ExternalLocal()),
			c(Outside, LoadBalancerIP, Reach(0).Preserved()),
			c(Pod, LoadBalancerIP, Reach(0, 1).Spread().Preserved()),
			c(Node, LoadBalancerIP, Reach(0, 1).Masqueraded())),
		one("load-balancer/local-policy-no-local-endpoint", followEXT,
			One(func() []servicelb.Endpoint { return RemoteEps(2) }, WithLoadBalancerIP(), ExternalLocal()),
			c(Outside, LoadBalancerIP, Dropped()), c(Pod, LoadBalancerIP, Reach(2)), c(Node, LoadBalancerIP, Reach(2).Masqueraded())),
		one("load-balancer/no-endpoints-rejects", followReject, One(func() []servicelb.Endpoint { return nil }, WithLoadBalancerIP()),
			every(LoadBalancerIP, Refused())...),
		one("load-balancer/proxy-mode-not-captured",
			"proxy newBaseServiceInfo: an ingress IP in ipMode Proxy is no load-balancer VIP of the service",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithProxiedLoadBalancerIP(), WithNodePort()),
			c(Outside, LoadBalancerIP, Dropped()), c(Pod, LoadBalancerIP, Dropped()), c(Node, LoadBalancerIP, Dropped()),
			c(Outside, NodePort, Reach(0, 1))),
		one("load-balancer/all-frontends", "iptables (*Proxier).syncProxyRules: one service port's frontends share its endpoints",
			One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, External()),
			c(Outside, ClusterIP, Reach(0, 1)), c(Outside, NodePort, Reach(0, 1)),
			c(Outside, ExternalIP, Reach(0, 1)), c(Outside, LoadBalancerIP, Reach(0, 1))),
	}
}

// holdLoadBalancerIP puts service 0's load-balancer IPs on the node, as a
// VIP-style load balancer's controller does.
func holdLoadBalancerIP(t *testing.T, e *Env) {
	for _, f := range Families() {
		a := e.LoadBalancerIP(f, 0)
		e.NodeHost().AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
	}
}

func sourceRangeScenarios() []Scenario {
	lb := func(ranges ...string) func(*Env) []servicelb.Service {
		return One(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, WithLoadBalancerIP(), WithNodePort(), WithSourceRanges(ranges...))
	}
	client := []string{"198.51.100.2/32", "fd00:c::2/128"}
	withNode := []string{"198.51.100.0/24", "fd00:c::/64"}
	sc := []Scenario{
		one("source-ranges/client-in-and-out", followFW, lb(client...),
			c(Outside, LoadBalancerIP, Reach(0, 1)), c(OutsideAt(1), LoadBalancerIP, Dropped()),
			c(Pod, LoadBalancerIP, Dropped())),
		one("source-ranges/node-not-admitted", followFW, lb(client...),
			c(Node, LoadBalancerIP, Dropped())),
		{Name: "source-ranges/node-holding-the-vip-admitted-through-its-address", Follows: followFW, Stages: []Stage{{
			Before: holdLoadBalancerIP, Services: lb(withNode...),
			Expect: []Check{c(Node, LoadBalancerIP, Reach(0, 1)), c(OutsideAt(1), LoadBalancerIP, Reach(0, 1)), c(Pod, LoadBalancerIP, Dropped())},
		}}},
		{Name: "source-ranges/node-holding-the-vip-not-admitted", Follows: followFW, Stages: []Stage{{
			Before: holdLoadBalancerIP, Services: lb(client...),
			Expect: []Check{c(Node, LoadBalancerIP, Dropped()), c(Outside, LoadBalancerIP, Reach(0, 1))},
		}}},
		one("source-ranges/other-family-open", followFW, lb("198.51.100.2/32"),
			Check{From: OutsideAt(1), To: LoadBalancerIP, Families: []servicelb.Family{servicelb.IPv4}, Want: Dropped()},
			Check{From: OutsideAt(1), To: LoadBalancerIP, Families: []servicelb.Family{servicelb.IPv6}, Want: Reach(0, 1)}),
		one("source-ranges/not-on-node-ports", followFW+" (the firewall chain is for load-balancer IPs only)", lb(client...),
			c(OutsideAt(1), NodePort, Reach(0, 1)), c(OutsideAt(1), ClusterIP, Reach(0, 1))),
		one("source-ranges/no-endpoints-rejects", followReject+" (no firewall chain without endpoints)",
			One(func() []servicelb.Endpoint { return nil }, WithLoadBalancerIP(), WithSourceRanges(client...)),
			c(Outside, LoadBalancerIP, Refused()), c(OutsideAt(1), LoadBalancerIP, Refused())),
		one("source-ranges/every-address", followFW, lb("0.0.0.0/0", "::/0"),
			c(OutsideAt(1), LoadBalancerIP, Reach(0, 1)), c(Node, LoadBalancerIP, Reach(0, 1))),
	}
	for i := range sc {
		sc[i].Needs |= servicelb.FeatureSourceRanges
	}
	return sc
}

func affinityScenarios() []Scenario {
	sticky := func(d time.Duration) func(*Env) []servicelb.Service {
		return One(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, WithAffinity(d), WithNodePort())
	}
	sc := []Scenario{
		one("affinity/sticks", followAffinity, sticky(time.Minute),
			c(Outside, ClusterIP, Reach(0, 1, 2).Sticky()), c(Pod, ClusterIP, Reach(0, 1, 2).Sticky()),
			c(Outside, NodePort, Reach(0, 1, 2).Sticky())),
		one("affinity/per-client", followAffinity, sticky(time.Minute),
			Check{Families: []servicelb.Family{servicelb.IPv4}, Proto: servicelb.TCP, Custom: pinsPerClient}),
		one("affinity/lasts-while-renewed-then-expires", followAffinity+" (a pin lasts while new flows come less than the timeout apart)",
			sticky(time.Second), Check{Families: []servicelb.Family{servicelb.IPv4}, Proto: servicelb.TCP, Custom: pinRenewsAndExpires}),
	}
	for i := range sc {
		sc[i].Needs |= servicelb.FeatureAffinity
	}
	sc[2].Needs |= servicelb.FeatureAffinityExpiry
	return sc
}

// pinsPerClient: each of twelve clients sticks to one endpoint, and they
// do not all stick to the same one (probability 3^-11 for a correct
// backend).
func pinsPerClient(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
	seen := map[string]bool{}
	for n := 1; n <= 12; n++ {
		first := ""
		for range 4 {
			r, err := e.Ask(t, OutsideAt(n), ClusterIP, f, p)
			if err != nil {
				t.Fatalf("client %d: %v", n, err)
			}
			if first == "" {
				first = r.Host
			} else if r.Host != first {
				t.Errorf("client %d: reached %s then %s, want one endpoint", n, first, r.Host)
			}
		}
		seen[first] = true
	}
	if len(seen) < 2 {
		t.Errorf("twelve clients all pinned to %v", seen)
	}
}

// pinRenewsAndExpires: with a 1s timeout, flows half a second apart keep
// one endpoint for 2.5s; a second and a half of silence later, twelve
// pinned clients do not all reach the endpoint they were pinned to again
// (probability 3^-12 for a correct backend, each drawing anew from three).
func pinRenewsAndExpires(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
	ask := func(from From) string {
		r, err := e.Ask(t, from, ClusterIP, f, p)
		if err != nil {
			t.Fatal(err)
		}
		return r.Host
	}
	first := ask(Outside)
	for range 5 {
		time.Sleep(500 * time.Millisecond)
		if h := ask(Outside); h != first {
			t.Fatalf("renewed every half second, the pin moved from %s to %s", first, h)
		}
	}
	pinned := map[int]string{}
	for n := 1; n <= 12; n++ {
		pinned[n] = ask(OutsideAt(n))
	}
	time.Sleep(1500 * time.Millisecond)
	for n := 1; n <= 12; n++ {
		if ask(OutsideAt(n)) != pinned[n] {
			return
		}
	}
	t.Errorf("after the timeout passed, all twelve clients reached their pinned endpoint again: %v", pinned)
}

func hairpinScenarios() []Scenario {
	return []Scenario{
		one("hairpin/remote-endpoint", followHairpin, One(func() []servicelb.Endpoint { return RemoteEps(1) }),
			c(Endpoint(1), ClusterIP, Reach(1).Masqueraded())),
		one("hairpin/local-endpoint", followHairpin, One(func() []servicelb.Endpoint { return Local(2) }),
			c(Endpoint(2), ClusterIP, Reach(2).Masqueraded())),
		one("hairpin/other-endpoints-keep-the-source", followHairpin, One(func() []servicelb.Endpoint { return RemoteEps(1) }),
			c(Endpoint(0), ClusterIP, Reach(1).Preserved())),
	}
}

func topologyScenarios() []Scenario {
	zone := func(n *servicelb.NodeConfig, _ *Env) { n.Zone = "zone-a" }
	hinted := func(f func() []servicelb.Endpoint, opts ...Opt) func(*Env) []servicelb.Service {
		return One(f, opts...)
	}
	z := func(zs ...string) []string { return zs }
	return []Scenario{
		oneNode("topology/zone-hints", followTopology, zone, hinted(func() []servicelb.Endpoint {
			return Join(Hinted(z("zone-a"), nil, RemoteEps(0)), Hinted(z("zone-b"), nil, RemoteEps(1, 2)))
		}), every(ClusterIP, Reach(0))...),
		oneNode("topology/node-hints", followTopology+" (PreferSameNode)", zone, hinted(func() []servicelb.Endpoint {
			return Join(Hinted(z("zone-a"), z(NodeName), Local(0)), Hinted(z("zone-a"), z(Remote), RemoteEps(1, 2)))
		}), c(Outside, ClusterIP, Reach(0))),
		oneNode("topology/mixed-hints-use-zones", followTopology+" (node hints only when every ready endpoint has one)", zone,
			hinted(func() []servicelb.Endpoint {
				return Join(Hinted(z("zone-a"), z(NodeName), Local(0)), Hinted(z("zone-a"), nil, RemoteEps(1, 2)))
			}), c(Outside, ClusterIP, Reach(0, 1, 2).Spread())),
		oneNode("topology/no-hint-for-this-zone", followTopology, zone, hinted(func() []servicelb.Endpoint {
			return Join(Hinted(z("zone-b"), nil, RemoteEps(0)), Hinted(z("zone-c"), nil, RemoteEps(1, 2)))
		}), c(Outside, ClusterIP, Reach(0, 1, 2).Spread())),
		oneNode("topology/hints-leave-the-local-set-alone", followTopology, zone, hinted(func() []servicelb.Endpoint {
			return Join(Hinted(z("zone-b"), nil, Local(0)), Hinted(z("zone-a"), nil, RemoteEps(1)))
		}, WithNodePort(), ExternalLocal()), c(Outside, NodePort, Reach(0)), c(Outside, ClusterIP, Reach(1))),
		// Only endpoint 0, of another zone, has a node hint (for this
		// node): node hints do not apply, zone hints do.
		oneNode("topology/partial-node-hints-zone-wins", followTopology+" (PreferSameZone when a ready endpoint lacks a node hint)", zone,
			hinted(func() []servicelb.Endpoint {
				return Join(Hinted(z("zone-b"), z(NodeName), Local(0)), Hinted(z("zone-a"), nil, RemoteEps(1, 2)))
			}), every(ClusterIP, Reach(1, 2).Spread())...),
	}
}

// session is the source port of the UDP sessions of the stale-flow
// scenarios.
const session = 40123

func udpSession(want Outcome) Check {
	return Check{From: Outside, To: ClusterIP, Proto: servicelb.UDP, Session: session, Want: want}
}

func staleFlowScenarios() []Scenario {
	stage := func(f func() []servicelb.Endpoint, checks ...Check) Stage {
		return Stage{Services: One(f), Expect: checks}
	}
	return []Scenario{
		{Name: "stale-flows/endpoint-removed", Follows: followStale, Stages: []Stage{
			stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0))),
			stage(func() []servicelb.Endpoint { return RemoteEps(1) }, udpSession(Reach(1))),
		}},
		{Name: "stale-flows/serving-terminating-endpoint-keeps-its-flows", Follows: followStale + " (serving endpoints keep their flows whatever is selected)", Stages: []Stage{
			stage(func() []servicelb.Endpoint { return Terminating(RemoteEps(0)) }, udpSession(Reach(0))),
			stage(func() []servicelb.Endpoint { return Join(Terminating(RemoteEps(0)), RemoteEps(1)) },
				udpSession(Reach(0)), Check{From: Outside, To: ClusterIP, Proto: servicelb.UDP, Want: Reach(1)}),
		}},
		{Name: "stale-flows/drained-endpoint-keeps-its-flows", Follows: followStale, Stages: []Stage{
			stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0))),
			stage(func() []servicelb.Endpoint { return Join(Weighted(0, RemoteEps(0)), RemoteEps(1)) },
				udpSession(Reach(0)), Check{From: Outside, To: ClusterIP, Proto: servicelb.UDP, Want: Reach(1)}),
		}},
		{Name: "stale-flows/deselected-by-policy-keeps-its-flows", Follows: followStale, Stages: []Stage{
			stage(func() []servicelb.Endpoint { return Join(RemoteEps(0)) }, udpSession(Reach(0))),
			{Services: One(func() []servicelb.Endpoint { return Join(RemoteEps(0), Local(1)) }, InternalLocal()),
				Expect: []Check{udpSession(Reach(0)), {From: Outside, To: ClusterIP, Proto: servicelb.UDP, Want: Reach(1)}}},
		}},
		{Name: "stale-flows/restart-reconciles-the-table", Follows: followStale + " (the first sync reconciles the whole table)", Stages: []Stage{
			stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0))),
			{Restart: true, Services: One(func() []servicelb.Endpoint { return RemoteEps(1) }), Expect: []Check{udpSession(Reach(1))}},
		}},
		// The endpoint stays, on another port: a flow keeps its
		// endpoint's address and port, so the old port's flows are
		// stale (the e2e test "Conntrack should be able to cleanup
		// conntrack entries when UDP service target port changes").
		{Name: "stale-flows/target-port-changed", Follows: followStale + " (an endpoint is its address and port)", Stages: []Stage{
			stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0).OnPort(TargetPort))),
			stage(func() []servicelb.Endpoint { return OnPorts(AltTargetPort, RemoteEps(0)) }, udpSession(Reach(0).OnPort(AltTargetPort))),
		}},
		// The node's and a pod's sockets are flows too, to a packet
		// filter's conntrack and to a socket-level balancer alike: each
		// unconnected socket keeps its endpoint while the set holds it,
		// and only the flows of a removed endpoint move.
		{Name: "stale-flows/node-and-pod-sockets-keep-their-endpoint", Follows: followStale + " (changes to a service leave its other flows alone)", Stages: []Stage{
			stage(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, Check{Custom: socketsKeepTheirEndpoint(0, 1, 2), Proto: servicelb.UDP}),
			stage(func() []servicelb.Endpoint { return RemoteEps(0, 1) }, Check{Custom: socketsKeepTheirEndpoint(0, 1), Proto: servicelb.UDP}),
			stage(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, Check{Custom: socketsKeepTheirEndpoint(0, 1, 2), Proto: servicelb.UDP}),
		}},
		// A flow is cut only where a serving endpoint can take its
		// client's next datagram: the last endpoint turned unready (it
		// still answers) and a deleted service leave their flows to run
		// out.
		needs(servicelb.FeatureLingeringFlows, Scenario{Name: "stale-flows/no-serving-endpoint-keeps-its-flows",
			Follows: followStale + " (a service without serving endpoints is left alone)", Stages: []Stage{
				stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0))),
				stage(func() []servicelb.Endpoint { return NotServing(RemoteEps(0)) }, udpSession(Reach(0))),
			}}),
		needs(servicelb.FeatureLingeringFlows, Scenario{Name: "stale-flows/deleted-service-keeps-its-flows",
			Follows: followStale + " (only the services proxied are reconciled)", Stages: []Stage{
				stage(func() []servicelb.Endpoint { return RemoteEps(0) }, udpSession(Reach(0))),
				{Services: func(*Env) []servicelb.Service { return nil }, Expect: []Check{udpSession(Reach(0))}},
			}}),
	}
}

// keptSockets is how many UDP sockets of each origin and kind
// (unconnected, connected) the stale-flow scenario of the node's and
// pods' sockets keeps.
const keptSockets = 6

// socketsKeepTheirEndpoint asks service 0's cluster IP from keptSockets
// unconnected and keptSockets connected UDP sockets of the node and of a
// pod, each kept across the scenario's stages: each must reach one of the
// endpoints set, and the one it reached in the stage before when that is
// one of them. A connected socket whose endpoint left the set may instead
// have been ended (netnstest.SocketEnded), as a socket-level balancer
// ends the flows it cannot move: its client's next connection must then
// reach one of the set.
func socketsKeepTheirEndpoint(set ...int) func(*testing.T, *Env, servicelb.Family, servicelb.Protocol) {
	return func(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol) {
		t.Helper()
		for _, from := range []From{Node, Pod} {
			a := e.lab.asker(t, from, f)
			// A socket's first flow is a new one: the explanation must
			// allow its answer.
			x := e.lab.explain(t, e, a, from, e.frontend(ClusterIP, f), p, 0)
			for _, kind := range []string{"unconnected", "connected"} {
				keep := netnstest.KeepSocket
				if kind == "connected" {
					keep = netnstest.KeepConnected
				}
				for i := range keptSockets {
					name := fmt.Sprintf("%s/%s/%s/%s/%d", scenarioName(e.idx), from, f, kind, i)
					what := fmt.Sprintf("%s %s socket %d from %s", f, kind, i, from)
					ask := func() (netnstest.Reply, error) {
						return a.h.Ask(t.Context(), p.Lower(), e.resolve(ClusterIP, f, p),
							e.lab.askOpts(a, p, 0, e.lab.o.AskTimeout, keep(name))...)
					}
					r, err := ask()
					was, seen := e.lab.flows.get(name)
					if err != nil && kind == "connected" && netnstest.SocketEnded(err) {
						if !seen || slices.Contains(set, was) {
							t.Errorf("%s: ended (%v), though its endpoint %d still serves", what, err, was)
							continue
						}
						r, err = ask()
						what += " (connected again after its socket was ended)"
					}
					if err != nil {
						t.Errorf("%s: %v, want an answer from endpoint %v", what, err, set)
						continue
					}
					at := hostIndex(r.Host)
					e.lab.flows.set(name, at)
					if !seen {
						if msg := e.lab.answerDisagrees(x, a, at, r.Client.Addr()); msg != "" {
							t.Error(explainFailure(what, msg, x))
						}
					}
					switch {
					case !slices.Contains(set, at):
						t.Errorf("%s: answered by %s, want one of endpoints %v", what, r.Host, set)
					case seen && slices.Contains(set, was) && was != at:
						t.Errorf("%s: answered by %s, want endpoint %d, which it reached before and the set still holds", what, r.Host, was)
					}
				}
			}
		}
	}
}

// The kube-proxy code the local-traffic detection scenarios follow: the
// detector each mode builds, whose IfLocal and IfNotLocal matches the
// proxiers put in their pod short-circuit and their masquerade of traffic
// from off the cluster.
const (
	followDetectRules       = "; iptables (*Proxier).syncProxyRules: KUBE-EXT pod short-circuit (IfLocal), KUBE-SVC masquerade of the rest (IfNotLocal)"
	followDetectClusterCIDR = "proxyutil.NewDetectLocalByCIDR with the cluster CIDR (getLocalDetector, --detect-local-mode=ClusterCIDR)" + followDetectRules
	followDetectNodeCIDR    = "proxyutil.NewDetectLocalByCIDR with the Node's spec.podCIDRs (getLocalDetector, --detect-local-mode=NodeCIDR)" + followDetectRules
	followDetectBridge      = "proxyutil.NewDetectLocalByBridgeInterface: -i <bridge>, iifname (getLocalDetector, --detect-local-mode=BridgeInterface)" + followDetectRules
	followDetectPrefix      = "proxyutil.NewDetectLocalByInterfaceNamePrefix: -i <prefix>+, iifname \"<prefix>*\" (getLocalDetector, --detect-local-mode=InterfaceNamePrefix)" + followDetectRules
)

// The node's detections in the scenarios' topology.
func detectNodeCIDR(n *servicelb.NodeConfig, e *Env) {
	n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByNodeCIDR, NodeCIDRs: e.NodeCIDRs()}
}

func detectBridge(n *servicelb.NodeConfig, _ *Env) {
	n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByBridgeInterface, BridgeInterface: PodBridge}
}

func detectPrefix(n *servicelb.NodeConfig, _ *Env) {
	n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByInterfaceNamePrefix, InterfaceNamePrefix: PodLinkPrefix}
}

func detectClusterCIDR(n *servicelb.NodeConfig, _ *Env) {
	n.DetectLocal = servicelb.DetectLocal{Mode: servicelb.LocalByClusterCIDR}
}

// detected are the checks of a pod the node's detection recognises, to a
// service under the external Local policy without a local endpoint on
// endpoints 1 and 2 (detectService): the pod short-circuits to the
// cluster set, unmasqueraded, through the node port as through the
// cluster IP.
func detected(pod From) []Check {
	return []Check{
		c(pod, NodePort, Reach(1, 2).Preserved()),
		c(pod, ClusterIP, Reach(1, 2).Preserved()),
	}
}

// undetected are the checks of a host the detection does not recognise,
// to the same service: it is outside, dropped at the node port for want of
// a local endpoint, and masqueraded to the cluster IP.
func undetected(host From) []Check {
	return []Check{
		c(host, NodePort, Dropped()),
		c(host, ClusterIP, Reach(1, 2).Masqueraded()),
	}
}

// outsideAndNode are the checks of the client outside and the node, which
// no detection makes a pod: the node short-circuits masqueraded.
func outsideAndNode() []Check {
	return []Check{
		c(Outside, NodePort, Dropped()), c(Outside, ClusterIP, Reach(1, 2).Masqueraded()),
		c(Node, NodePort, Reach(1, 2).Masqueraded()), c(Node, ClusterIP, Reach(1, 2).Masqueraded()),
	}
}

// detectService is a service under the external Local policy with a node
// port and no local endpoint: pods and outside clients meet different
// verdicts at both frontends.
func detectService() func(*Env) []servicelb.Service {
	return One(func() []servicelb.Endpoint { return RemoteEps(1, 2) }, WithNodePort(), ExternalLocal())
}

func detectLocalScenarios() []Scenario {
	sc := []Scenario{
		oneNode("detect-local/cluster-cidr-every-pod", followDetectClusterCIDR, detectClusterCIDR, detectService(),
			slices.Concat(detected(Pod), detected(BridgedPod), outsideAndNode())...),
		oneNode("detect-local/node-cidr-only-the-nodes-pods", followDetectNodeCIDR, detectNodeCIDR, detectService(),
			slices.Concat(detected(Pod), undetected(BridgedPod), undetected(Endpoint(0)), outsideAndNode())...),
		needs(servicelb.FeatureLocalByInterface, oneNode("detect-local/bridge-interface", followDetectBridge, detectBridge, detectService(),
			slices.Concat(detected(BridgedPod), undetected(Pod), outsideAndNode())...)),
		needs(servicelb.FeatureLocalByInterface, oneNode("detect-local/interface-name-prefix", followDetectPrefix, detectPrefix, detectService(),
			slices.Concat(detected(Pod), undetected(BridgedPod), undetected(Endpoint(0)), outsideAndNode())...)),
		needs(servicelb.FeatureLocalByInterface, Scenario{Name: "detect-local/changes", Follows: "kube-proxy restarted with another --detect-local-mode: " +
			"the rules of every service follow the new detector", Stages: []Stage{
			{Node: detectBridge, Services: detectService(), Expect: slices.Concat(detected(BridgedPod), undetected(Pod))},
			{Node: detectPrefix, Services: detectService(), Expect: slices.Concat(detected(Pod), undetected(BridgedPod))},
			{Node: detectNodeCIDR, Services: detectService(), Expect: slices.Concat(detected(Pod), undetected(BridgedPod))},
			{Services: detectService(), Expect: slices.Concat(detected(Pod), detected(BridgedPod))},
		}}),
	}
	return sc
}

func conflictScenarios() []Scenario {
	shared := func(e *Env) []netip.Addr {
		return []netip.Addr{e.ExternalIP(servicelb.IPv4, 0), e.ExternalIP(servicelb.IPv6, 0)}
	}
	nodeIPs := func(e *Env) []netip.Addr { return []netip.Addr{e.NodeIP(servicelb.IPv4), e.NodeIP(servicelb.IPv6)} }
	return []Scenario{
		one("conflict/shared-external-ip", "kproxy's own: one frontend, two services: the first name holds it, the other keeps the rest",
			func(e *Env) []servicelb.Service {
				return []servicelb.Service{
					e.Service(1, RemoteEps(1), ExternalIPAt(shared), Named("b")),
					e.Service(0, RemoteEps(0), WithExternalIP(), Named("a")),
				}
			},
			c(Outside, ExternalIP, Reach(0)), c(Outside, ClusterIP, Reach(0)), c(Outside, ClusterIP.Of(1), Reach(1))),
		one("conflict/external-ip-on-another-services-node-port", "iptables (*Proxier).syncProxyRules: service IPs are matched before KUBE-NODEPORTS",
			func(e *Env) []servicelb.Service {
				return []servicelb.Service{
					e.Service(0, RemoteEps(0), WithNodePort(), Named("a")),
					e.Service(1, RemoteEps(1), ExternalIPAt(nodeIPs), PortOf(func(e *Env) uint16 { return e.NodePortOf(0) }), Named("b")),
				}
			},
			c(Outside, NodePort, Reach(1)), c(Pod, NodePort, Reach(1)), c(Outside, ClusterIP, Reach(0))),
	}
}

func schedulerScenarios() []Scenario {
	const followLeftOut = "kproxy's own: a service the backend cannot express is left out, the rest applied in the same sync"
	return []Scenario{
		{Name: "left-out/unsupported-scheduler", Follows: followLeftOut, Refuses: true,
			Stages: []Stage{
				{Services: One(func() []servicelb.Endpoint { return RemoteEps(0) }), Expect: []Check{c(Outside, ClusterIP, Reach(0))}},
				{Services: func(e *Env) []servicelb.Service {
					return []servicelb.Service{e.Service(0, RemoteEps(1)), e.Service(1, RemoteEps(1), WithScheduler(e.UnsupportedScheduler()))}
				}, LeftOut: servicelb.ErrUnsupported, Expect: []Check{c(Outside, ClusterIP, Reach(1))}},
			}},
		{Name: "left-out/endpoint-capacity", Follows: followLeftOut,
			Bounded: true, Stages: []Stage{
				{Services: One(func() []servicelb.Endpoint { return RemoteEps(0) }), Expect: []Check{c(Outside, ClusterIP, Reach(0))}},
				{Services: func(e *Env) []servicelb.Service {
					return []servicelb.Service{e.Service(0, RemoteEps(1)), e.Service(1, manyEndpoints(e.lab.p.Capabilities().MaxEndpoints+1))}
				}, LeftOut: servicelb.ErrCapacity, Expect: []Check{c(Outside, ClusterIP, Reach(1))}},
			}},
		{Name: "left-out/one-bad-among-a-thousand", Follows: followLeftOut + "; a later change to a good one reaches the kernel in the next sync",
			Refuses: true, Stages: []Stage{
				{Services: aThousand(func() []servicelb.Endpoint { return RemoteEps(0) }), LeftOut: servicelb.ErrUnsupported,
					Expect: []Check{c(Outside, ClusterIP, Reach(0)), c(Outside, ClusterIP.Of(1), Reach(2))}},
				{Services: aThousand(func() []servicelb.Endpoint { return RemoteEps(1) }), LeftOut: servicelb.ErrUnsupported,
					Expect: []Check{c(Outside, ClusterIP, Reach(1)), c(Outside, ClusterIP.Of(1), Reach(2))}},
			}},
		{Name: "scheduler/maglev-spreads-one-clients-connections", Follows: "ipvs (*Proxier).syncService: the mh scheduler hashes the source port (FlagSourceHash)",
			Scheduler: servicelb.SchedulerMaglev, Stages: []Stage{{
				Services: One(func() []servicelb.Endpoint { return RemoteEps(0, 1, 2) }, WithScheduler(servicelb.SchedulerMaglev)),
				Expect:   []Check{{From: Outside, To: ClusterIP, Proto: servicelb.TCP, Want: Reach(0, 1, 2).Spread()}},
			}}},
	}
}

// aThousand returns service 0 served by eps, service 1 served by endpoint
// 2, a service the backend refuses, and a thousand more, each with a
// cluster IP of 10.98.0.0/16 and an endpoint no host holds.
func aThousand(eps func() []servicelb.Endpoint) func(*Env) []servicelb.Service {
	return func(e *Env) []servicelb.Service {
		out := []servicelb.Service{e.Service(0, eps()), e.Service(1, RemoteEps(2)),
			e.Service(2, RemoteEps(2), WithScheduler(e.UnsupportedScheduler()))}
		for i := range 1000 {
			out = append(out, servicelb.Service{
				Name:       fmt.Sprintf("%s/filler-%d", scenarioName(e.idx), i),
				ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 98, byte(i / 250), byte(1 + i%250)})},
				Ports:      []servicelb.Port{{Protocol: servicelb.TCP, Port: ServicePort, TargetPort: TargetPort}},
				Endpoints:  []servicelb.Endpoint{{Addr: netip.AddrFrom4([4]byte{10, 246, byte(i / 250), byte(1 + i%250)})}},
			})
		}
		return out
	}
}

// manyEndpoints returns n ready endpoints on addresses no host holds.
func manyEndpoints(n int) []servicelb.Endpoint {
	out := make([]servicelb.Endpoint, n)
	for i := range out {
		out[i] = servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 245, byte(i >> 8), byte(i)})}
	}
	return out
}

// floodConns is how many idle connections the flood scenario holds to
// one service: more than a process with the common limit of 1,024
// descriptors could take if it spent one on each, and few enough for a
// test process holding both ends (the client's and the echo server's)
// under a limit of 4,096.
const floodConns = 1000

func loadScenarios() []Scenario {
	return []Scenario{
		{Name: "load/flood-leaves-other-services", Follows: "kube-proxy's kernel rules hold a flow as a conntrack entry, so a flood of connections to one service " +
			"takes nothing another service needs; a proxy that spends descriptors on flows bounds them (package userspace: its flow budget)",
			Stages: []Stage{{
				Services: func(e *Env) []servicelb.Service {
					return []servicelb.Service{e.Service(0, RemoteEps(0)), e.Service(1, RemoteEps(1))}
				},
				Expect: []Check{{Custom: floodLeavesOtherServices, Proto: servicelb.TCP}},
			}}},
	}
}

// floodLeavesOtherServices: the outside client holds floodConns idle TCP
// connections to service 0's cluster IP, as a leaking or hostile client
// would, and meanwhile service 1 answers every ask of every protocol of
// the run from every origin. The echo server ends an idle connection
// after 5 s, which bounds the flood; the asks take less.
func floodLeavesOtherServices(t *testing.T, e *Env, f servicelb.Family, _ servicelb.Protocol) {
	t.Helper()
	dst := e.resolve(ClusterIP, f, servicelb.TCP)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	err := e.lab.tp.Client.Do(func() error {
		d := net.Dialer{Timeout: time.Second}
		for range floodConns {
			// A flow a proxy sheds may end before its dial returns.
			if c, err := d.Dial("tcp", dst.String()); err == nil {
				held = append(held, c)
			}
		}
		return nil
	})
	require.NoError(t, err)
	for _, p := range e.Protocols() {
		for _, from := range []From{Outside, Pod, Node} {
			for range 5 {
				r, err := e.Ask(t, from, ClusterIP.Of(1), f, p)
				if err != nil || r.Host != e.Host(1).Name {
					t.Errorf("%s %s from %s to service 1 while %d connections to service 0 are held: %+v, %v, want an answer from %s",
						f, p.Lower(), from, len(held), r, err, e.Host(1).Name)
				}
			}
		}
	}
}
