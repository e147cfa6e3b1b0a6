// Package healthcheck serves what load balancers and orchestrators probe on
// a node proxy, as kube-proxy serves it: a health check node port for
// every service that has one, and the proxy's own health.
//
// # Health check node ports
//
// A load balancer in front of a service with the external Local policy
// sends the service's traffic only to the nodes that have an endpoint of
// it: the others drop it, to keep the client's address. It learns which
// nodes those are by probing the service's health check node port on
// every node. [Services] serves these ports: one HTTP server per service
// that holds a health check node port in a servicelb.State, listening on
// the node-port addresses given (by default every address of the
// namespace, both families), answering every path with
//
//	200 OK while the service has an endpoint on this node that is ready
//	(servicelb.State.HealthCheck decides which count) and the proxy keeps
//	the kernel up to date, 503 Service Unavailable otherwise;
//	Content-Type: application/json
//	X-Content-Type-Options: nosniff
//	X-Load-Balancing-Endpoint-Weight: <the count of local endpoints>
//
// and a body naming the service ("namespace/name" splits at the first
// slash; a name without one has an empty namespace):
//
//	{
//		"service": {
//			"namespace": "default",
//			"name": "web"
//		},
//		"localEndpoints": 1,
//		"serviceProxyHealthy": true
//	}
//
// [Services.Sync] makes the servers match a state: it opens the ports of
// services that gained one, closes those of services that lost theirs or
// went, moves a server whose port changed, and updates the counts of the
// others, in the cost of what changed (servicelb.Diff) after the first. A
// port that cannot be opened (another program holds it, an address the
// namespace lacks) is reported as a *ListenError naming the service and
// the port, joined with the others, while every other service is served;
// the next Sync tries it again. Call Sync with every state the proxy
// applies: a servicelb.Runner does so through Hooks.Applied:
//
//	hooks := servicelb.Hooks{Applied: func(st *servicelb.State) { report(hc.Sync(st)) }}
//
// # The proxy's health
//
// [Proxy] serves kube-proxy's /healthz and /livez (on 0.0.0.0:10256 by
// kube-proxy's default) from a servicelb.Runner's Health. The proxy is
// live while no change has waited Timeout or longer to be applied
// (servicelb.Health.Stalled): the kernel keeps up with the desired state.
// The bound defaults to DefaultTimeout, twice the Runner's
// MaxSyncInterval, as kube-proxy allows twice its sync period: a change
// waits at most MinSyncInterval for its sync, and a failing sync is
// retried within MaxSyncInterval, so a change still waiting after two of
// those is stuck. /livez answers 200 while live and 503 otherwise;
// /healthz answers 200 while the Runner is ready (its first sync done),
// live, and the node eligible (ProxyOptions.NodeEligible: kube-proxy
// says a node being deleted, or tainted ToBeDeletedByClusterAutoscaler, is
// not), 503 otherwise. Unlike kube-proxy, which answers 200 while it
// starts, /healthz answers 503 before the first sync, so that no load
// balancer sends traffic to a node whose rules are not in yet; /livez
// answers 200 then, so that a slow start is not taken for a hang. Both
// answer JSON, with kube-proxy's headers and fields:
//
//	{"lastUpdated":"2026-01-01T00:00:00Z","currentTime":"2026-01-01T00:00:00Z","nodeEligible":true,"healthy":true,
//	 "status":{"IPv4":{"lastUpdated":"2026-01-01T00:00:00Z","healthy":true},"IPv6":{"lastUpdated":"2026-01-01T00:00:00Z","healthy":true}}}
//
// where lastUpdated is the current time while the answer is 200 (as
// kube-proxy's, for compatibility) and the end of the last successful
// sync otherwise, healthy is the proxy's health without the node's
// eligibility, and nodeEligible is left out of /livez. status holds, as
// kube-proxy's holds one per proxier, each address family the Health
// reports (servicelb.Health.Families: those the proxier programs), named
// as Kubernetes names them: healthy while no change that touched the
// family has waited Timeout or longer, and lastUpdated the end of the last
// successful sync, which programs every family. ProxyOptions.Answered
// counts the answers by status code, for kube-proxy's
// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total. A health
// check node port's serviceProxyHealthy is the proxy's liveness
// (Proxy.Live).
//
// # Clients that may be hostile
//
// Both listen on every address of the node by default, so anyone who
// reaches the node reaches them. Each server answers GET and HEAD only
// (405 otherwise), reads at most 8 KiB of headers (431 beyond) within 5 s
// and a request within 10 s, writes its answer within 10 s and closes a
// keep-alive connection idle for a minute.
// The health check node ports share one budget of connections
// (ServicesOptions.MaxConns, 512 by default) and the proxy's health has
// its own (ProxyOptions.MaxConns, 128): a connection beyond it is closed
// as soon as it is accepted, with a warning at most every 10 s. A flood
// of connections thus costs a bounded amount of memory and descriptors:
// 150 clients that each send a header line of a million bytes and wait
// cost the server under 1 MB (about 260 MB with Go's defaults, which
// kube-proxy's servers keep), and the health is answered meanwhile once
// the server has refused them.
//
// # Namespaces, privileges, what it owns
//
// Every listener is opened in the network namespace the options name
// (netns.NsHandle; zero or netns.None() for the caller's), from a thread
// switched into it, so the caller's threads never change namespace: the
// ports are the node's where the proxier programs it. Entering another
// namespace needs CAP_SYS_ADMIN; ports below 1024 need
// CAP_NET_BIND_SERVICE. The package owns its listeners and nothing in the
// kernel besides: Services.Close and the end of Proxy.Run close them and
// wait for their goroutines; no Cleanup is needed. The iptables backend
// accepts TCP to every health check node port
// (servicelb.ServicePort.HealthCheckNodePort) in its filter chains, as
// kube-proxy's iptables mode does; the other backends filter nothing
// there.
package healthcheck
