//go:build linux

package conformance

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Opt shapes a scenario's service.
type Opt func(e *Env, s *servicelb.Service, i int)

// Service returns service i of the scenario, named "s<scenario>/svc<i>":
// a cluster IP of each family and one port per protocol of the run (named
// after the protocol: "tcp", "udp", "sctp"), ServicePort to TargetPort,
// served by eps, shaped by opts.
func (e *Env) Service(i int, eps []servicelb.Endpoint, opts ...Opt) servicelb.Service {
	s := servicelb.Service{
		Name:       fmt.Sprintf("%s/svc%d", scenarioName(e.idx), i),
		ClusterIPs: []netip.Addr{e.ClusterIP(servicelb.IPv4, i), e.ClusterIP(servicelb.IPv6, i)},
		Endpoints:  eps,
	}
	for _, p := range e.Protocols() {
		s.Ports = append(s.Ports, servicelb.Port{Name: p.Lower(), Protocol: p, Port: ServicePort, TargetPort: TargetPort})
	}
	for _, o := range opts {
		o(e, &s, i)
	}
	return s
}

// Eps returns endpoints on the hosts given (0 to Endpoints-1), ready, of
// both families, on node (NodeName for local ones, Remote for others).
func Eps(node string, hosts ...int) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, h := range hosts {
		for _, a := range []netip.Addr{netnstest.BackendIPv4(h), netnstest.BackendIPv6(h)} {
			out = append(out, servicelb.Endpoint{Addr: a, NodeName: node})
		}
	}
	return out
}

// Local returns ready endpoints on this node; RemoteEps on another.
func Local(hosts ...int) []servicelb.Endpoint     { return Eps(NodeName, hosts...) }
func RemoteEps(hosts ...int) []servicelb.Endpoint { return Eps(Remote, hosts...) }

// Join concatenates endpoint lists.
func Join(lists ...[]servicelb.Endpoint) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// Edit applies f to every endpoint of a list, for conditions and weights.
func Edit(eps []servicelb.Endpoint, f func(*servicelb.Endpoint)) []servicelb.Endpoint {
	for i := range eps {
		f(&eps[i])
	}
	return eps
}

// Terminating marks endpoints serving and terminating, not ready.
func Terminating(eps []servicelb.Endpoint) []servicelb.Endpoint {
	return Edit(eps, func(e *servicelb.Endpoint) { e.Ready, e.Serving, e.Terminating = new(false), new(true), true })
}

// NotServing marks endpoints neither ready nor serving.
func NotServing(eps []servicelb.Endpoint) []servicelb.Endpoint {
	return Edit(eps, func(e *servicelb.Endpoint) { e.Ready, e.Serving = new(false), new(false) })
}

// Weighted gives endpoints weight w.
func Weighted(w uint16, eps []servicelb.Endpoint) []servicelb.Endpoint {
	return Edit(eps, func(e *servicelb.Endpoint) { e.Weight = servicelb.Weight(w) })
}

// OnPorts has endpoints serve every port of the service (as One builds
// it) on port instead of TargetPort.
func OnPorts(port uint16, eps []servicelb.Endpoint) []servicelb.Endpoint {
	return Edit(eps, func(e *servicelb.Endpoint) {
		e.Ports = map[string]uint16{}
		for _, p := range []servicelb.Protocol{servicelb.TCP, servicelb.UDP, servicelb.SCTP} {
			e.Ports[p.Lower()] = port
		}
	})
}

// Hinted gives endpoints topology hints.
func Hinted(zones, nodes []string, eps []servicelb.Endpoint) []servicelb.Endpoint {
	return Edit(eps, func(e *servicelb.Endpoint) { e.Hints = servicelb.Hints{ForZones: zones, ForNodes: nodes} })
}

// WithNodePort gives every port the service's node port.
func WithNodePort() Opt {
	return func(e *Env, s *servicelb.Service, i int) {
		for j := range s.Ports {
			s.Ports[j].NodePort = e.NodePortOf(i)
		}
	}
}

// WithHealthCheckNodePort gives the service its health check node port
// (Env.HealthCheckNodePortOf).
func WithHealthCheckNodePort() Opt {
	return func(e *Env, s *servicelb.Service, i int) { s.HealthCheckNodePort = e.HealthCheckNodePortOf(i) }
}

// WithExternalIP gives the service its external IPs of both families.
func WithExternalIP() Opt {
	return func(e *Env, s *servicelb.Service, i int) {
		s.ExternalIPs = []netip.Addr{e.ExternalIP(servicelb.IPv4, i), e.ExternalIP(servicelb.IPv6, i)}
	}
}

// WithLoadBalancerIP gives the service its load-balancer IPs of both
// families.
func WithLoadBalancerIP() Opt {
	return func(e *Env, s *servicelb.Service, i int) {
		s.LoadBalancerIPs = []netip.Addr{e.LoadBalancerIP(servicelb.IPv4, i), e.LoadBalancerIP(servicelb.IPv6, i)}
	}
}

// WithProxiedLoadBalancerIP gives the service its load-balancer IPs of
// both families in Proxy mode (servicelb.Service.ProxiedLoadBalancerIPs).
func WithProxiedLoadBalancerIP() Opt {
	return func(e *Env, s *servicelb.Service, i int) {
		s.ProxiedLoadBalancerIPs = []netip.Addr{e.LoadBalancerIP(servicelb.IPv4, i), e.LoadBalancerIP(servicelb.IPv6, i)}
	}
}

// External is WithNodePort, WithExternalIP and WithLoadBalancerIP.
func External() Opt {
	return func(e *Env, s *servicelb.Service, i int) {
		for _, o := range []Opt{WithNodePort(), WithExternalIP(), WithLoadBalancerIP()} {
			o(e, s, i)
		}
	}
}

// ExternalLocal and InternalLocal set the traffic policies to Local.
func ExternalLocal() Opt {
	return func(_ *Env, s *servicelb.Service, _ int) { s.ExternalTrafficPolicy = servicelb.PolicyLocal }
}

// InternalLocal sets the internal traffic policy to Local.
func InternalLocal() Opt {
	return func(_ *Env, s *servicelb.Service, _ int) { s.InternalTrafficPolicy = servicelb.PolicyLocal }
}

// WithAffinity turns ClientIP affinity on with a timeout.
func WithAffinity(d time.Duration) Opt {
	return func(_ *Env, s *servicelb.Service, _ int) {
		s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: d}
	}
}

// WithSourceRanges sets the load-balancer source ranges.
func WithSourceRanges(ranges ...string) Opt {
	return func(_ *Env, s *servicelb.Service, _ int) {
		for _, r := range ranges {
			s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(r))
		}
	}
}

// WithScheduler sets the scheduler hint.
func WithScheduler(sch servicelb.Scheduler) Opt {
	return func(_ *Env, s *servicelb.Service, _ int) { s.Scheduler = sch }
}

// Named renames the service "s<scenario>/<name>", to order services by
// name.
func Named(name string) Opt {
	return func(e *Env, s *servicelb.Service, _ int) { s.Name = scenarioName(e.idx) + "/" + name }
}

// OnlyFamily keeps the service's cluster IP, external and load-balancer
// IPs of one family.
func OnlyFamily(f servicelb.Family) Opt {
	return func(_ *Env, s *servicelb.Service, _ int) {
		keep := func(as []netip.Addr) []netip.Addr {
			var out []netip.Addr
			for _, a := range as {
				if servicelb.FamilyOf(a) == f {
					out = append(out, a)
				}
			}
			return out
		}
		s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs = keep(s.ClusterIPs), keep(s.ExternalIPs), keep(s.LoadBalancerIPs)
	}
}

// ExternalIPAt sets the service's external IPs to the given addresses
// instead of its own.
func ExternalIPAt(addrs func(e *Env) []netip.Addr) Opt {
	return func(e *Env, s *servicelb.Service, _ int) { s.ExternalIPs = addrs(e) }
}

// AtNodePort gives the service the node port of service j instead of its
// own, as the port of its addresses: for clashes with a node port.
func PortOf(port func(e *Env) uint16) Opt {
	return func(e *Env, s *servicelb.Service, _ int) {
		for j := range s.Ports {
			s.Ports[j].Port = port(e)
		}
	}
}

// Services is a shorthand for a stage's service list.
func Services(f func(e *Env) []servicelb.Service) func(e *Env) []servicelb.Service { return f }

// One returns a stage's services: one service, service 0, served by eps.
func One(eps func() []servicelb.Endpoint, opts ...Opt) func(e *Env) []servicelb.Service {
	return func(e *Env) []servicelb.Service { return []servicelb.Service{e.Service(0, eps(), opts...)} }
}
