package kube

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilnet "k8s.io/utils/net"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Labels and annotations this package reads.
const (
	// LabelProxyName names the proxy that handles a service: a proxy
	// without a name handles only services without the label, as
	// kube-proxy.
	LabelProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks a Service or an EndpointSlice no proxy reads:
	// the slices of a headless service carry it, and a slice given it
	// leaves its service's endpoints, as kube-proxy watches none.
	LabelHeadless = "service.kubernetes.io/headless"
	// LabelZone is the Node's topology zone, which topology hints name.
	LabelZone = corev1.LabelTopologyZone
	// AnnotationScheduler sets servicelb.Service.Scheduler, such as "rr",
	// for the backends that schedule (ipvs).
	AnnotationScheduler = "kproxy.dev/scheduler"
)

// ErrSkipped marks a service a proxy does not handle (headless,
// ExternalName, one without a cluster IP); it is not a mistake.
var ErrSkipped = errors.New("not load-balanced")

// Translation is a Service and its EndpointSlices as servicelb takes
// them.
type Translation struct {
	// Service is named "namespace/name".
	Service servicelb.Service
	// Skipped names the parts of the objects left out because they cannot
	// be read even as kube-proxy reads them (an address that is no IP, a
	// source range that is no CIDR, a slice port without a name or a
	// number): the rest of the service is proxied, as kube-proxy proxies
	// it.
	Skipped []error
}

// Translate turns a Service and its EndpointSlices into a servicelb
// service, with kube-proxy's reading of them:
//
//   - headless and ExternalName services, and services whose cluster IP
//     is no IP, are not load-balanced (an error wrapping ErrSkipped);
//   - addresses are read as kube-proxy reads them, leading zeros of IPv4
//     octets included (10.244.001.003 is 10.244.1.3);
//   - load-balancer ingress addresses in Proxy mode are not captured;
//   - an endpoint serves exactly the ports its slice lists, matched to the
//     service's by name and protocol; the endpoint conditions (ready,
//     serving, terminating), node names, zones and topology hints are
//     kept as they are, for servicelb's endpoint selection.
//
// It reads the slices given, whatever their labels: the Source reads no
// slice labelled LabelHeadless.
func Translate(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (Translation, error) {
	name := svc.Namespace + "/" + svc.Name
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return Translation{}, fmt.Errorf("service %s: ExternalName: %w", name, ErrSkipped)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return Translation{}, fmt.Errorf("service %s: headless: %w", name, ErrSkipped)
	}
	t := &translation{}
	out := servicelb.Service{Name: name}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for i, s := range ips {
		a, ok := parseAddr(s)
		if !ok {
			return Translation{}, fmt.Errorf("service %s: spec.clusterIPs[%d] %q is no IP address: %w", name, i, s, ErrSkipped)
		}
		out.ClusterIPs = append(out.ClusterIPs, a)
	}
	out.ExternalIPs = t.addrs("spec.externalIPs", svc.Spec.ExternalIPs)
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		t.loadBalancer(svc, &out)
	}
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	for _, p := range svc.Spec.Ports {
		sp := servicelb.Port{Name: p.Name, Protocol: servicelb.Protocol(cmp.Or(p.Protocol, corev1.ProtocolTCP)), Port: uint16(p.Port)}
		if nodePorts {
			sp.NodePort = uint16(p.NodePort)
		}
		if p.TargetPort.Type == intstr.Int {
			sp.TargetPort = uint16(p.TargetPort.IntVal)
		}
		out.Ports = append(out.Ports, sp)
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		out.InternalTrafficPolicy = servicelb.TrafficPolicy(*p)
	}
	if svc.Spec.ExternalTrafficPolicy != "" {
		out.ExternalTrafficPolicy = servicelb.TrafficPolicy(svc.Spec.ExternalTrafficPolicy)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		out.Affinity.ClientIP = true
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			out.Affinity.Timeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	out.Scheduler = servicelb.Scheduler(svc.Annotations[AnnotationScheduler])
	out.Endpoints = t.endpoints(out.Ports, slices)
	return Translation{Service: out, Skipped: t.skipped}, nil
}

// translation collects what a translation leaves out.
type translation struct{ skipped []error }

func (t *translation) skip(format string, args ...any) {
	t.skipped = append(t.skipped, fmt.Errorf(format, args...))
}

func (t *translation) loadBalancer(svc *corev1.Service, out *servicelb.Service) {
	var lb, proxied []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		// An ingress in Proxy mode is a load balancer that proxies to
		// the nodes: its address is not captured on the node.
		// (kube-proxy captures no address of a mode it does not know
		// either.)
		switch {
		case in.IP == "":
		case in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP:
			lb = append(lb, in.IP)
		default:
			proxied = append(proxied, in.IP)
		}
	}
	out.LoadBalancerIPs = t.addrs("status.loadBalancer.ingress", lb)
	out.ProxiedLoadBalancerIPs = t.addrs("status.loadBalancer.ingress", proxied)
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		// Surrounding spaces are ignored and host bits cleared, as
		// kube-proxy reads the ranges.
		_, n, err := utilnet.ParseCIDRSloppy(strings.TrimSpace(s))
		var p netip.Addr
		ok := err == nil
		if ok {
			p, ok = netip.AddrFromSlice(n.IP)
		}
		if !ok {
			t.skip("spec.loadBalancerSourceRanges[%d] %q is no CIDR", i, s)
			continue
		}
		ones, _ := n.Mask.Size()
		out.SourceRanges = append(out.SourceRanges, netip.PrefixFrom(p.Unmap(), ones).Masked())
	}
	out.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
}

// parseAddr reads an address as kube-proxy does (ParseIPSloppy: leading
// zeros of IPv4 octets are decimal).
func parseAddr(s string) (netip.Addr, bool) {
	ip := utilnet.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

func (t *translation) addrs(field string, in []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range in {
		a, ok := parseAddr(s)
		if !ok {
			t.skip("%s[%d] %q is no IP address", field, i, s)
			continue
		}
		out = append(out, a)
	}
	return out
}

// endpoints translates the endpoints of the slices: the first address of
// each, serving exactly the slice's ports that match a port of the
// service by name and protocol, as kube-proxy keys a slice's endpoints by
// (service, port name, protocol). FQDN slices are ignored.
func (t *translation) endpoints(svcPorts []servicelb.Port, slices []*discoveryv1.EndpointSlice) []servicelb.Endpoint {
	protocols := map[string]servicelb.Protocol{}
	for _, p := range svcPorts {
		protocols[p.Name] = p.Protocol
	}
	var out []servicelb.Endpoint
	for _, sl := range slices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		ports := map[string]uint16{}
		for i, p := range sl.Ports {
			switch {
			case p.Name == nil:
				t.skip("endpointslice %s: ports[%d] has no name", sl.Name, i)
			case p.Port == nil || *p.Port <= 0 || *p.Port > 65535:
				t.skip("endpointslice %s: ports[%d] (%q) has no port number", sl.Name, i, *p.Name)
			case servicelb.Protocol(cmp.Or(deref(p.Protocol), corev1.ProtocolTCP)) != protocols[*p.Name]:
				// A port of another protocol, or of a name the service
				// has not: no endpoint of the service's ports.
			default:
				ports[*p.Name] = uint16(*p.Port)
			}
		}
		for i, e := range sl.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			a, ok := parseAddr(e.Addresses[0])
			if !ok {
				t.skip("endpointslice %s: endpoints[%d].addresses[0] %q is no IP address", sl.Name, i, e.Addresses[0])
				continue
			}
			out = append(out, endpoint(a, e, ports))
		}
	}
	return out
}

func endpoint(a netip.Addr, e discoveryv1.Endpoint, ports map[string]uint16) servicelb.Endpoint {
	// Unknown conditions count as true, terminating as false, as
	// kube-proxy reads them.
	ready := e.Conditions.Ready == nil || *e.Conditions.Ready
	serving := e.Conditions.Serving == nil || *e.Conditions.Serving
	ep := servicelb.Endpoint{
		Addr: a, Ports: ports, OnlyNamedPorts: true,
		Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		NodeName:    deref(e.NodeName), Zone: deref(e.Zone),
	}
	// servicelb's nil conditions are ready, and serving as ready says.
	if !ready {
		ep.Ready = new(false)
	}
	if serving != ready {
		ep.Serving = new(serving)
	}
	if h := e.Hints; h != nil {
		for _, z := range h.ForZones {
			ep.Hints.ForZones = append(ep.Hints.ForZones, z.Name)
		}
		for _, n := range h.ForNodes {
			ep.Hints.ForNodes = append(ep.Hints.ForNodes, n.Name)
		}
	}
	return ep
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
