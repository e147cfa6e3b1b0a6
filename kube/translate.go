// Package kubesource feeds a servicelb.Runner from Kubernetes: client-go
// informers on Services and EndpointSlices, translated to servicelb
// services with kube-proxy's rules. Headless and ExternalName services are
// skipped; the service.kubernetes.io/service-proxy-name label picks which
// services this proxy handles, and EndpointSlices labelled
// service.kubernetes.io/headless are not read; load-balancer ingress addresses in Proxy
// mode are not captured; an endpoint serves exactly the ports its slice
// lists; endpoint conditions (ready, serving, terminating), node names,
// zones and topology hints are kept as they are, for servicelb's endpoint
// selection.
package kubesource

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

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Labels and annotations this source reads.
const (
	// LabelProxyName names the proxy that handles a service: a proxy
	// without a name handles only services without the label.
	LabelProxyName = "service.kubernetes.io/service-proxy-name"
	// LabelHeadless marks an EndpointSlice that no proxy reads: the
	// slices of a headless service carry it, and a slice given it leaves
	// its service's endpoints, as kube-proxy watches no such slice.
	LabelHeadless = "service.kubernetes.io/headless"
	// AnnotationScheduler sets servicelb.Service.Scheduler, such as "rr".
	AnnotationScheduler = "kproxy.dev/scheduler"
)

// ErrSkipped marks a service this proxy does not handle (headless,
// ExternalName); it is not a mistake.
var ErrSkipped = errors.New("not load-balanced")

// Translate turns a Service and its EndpointSlices into a servicelb
// service named "namespace/name". It returns an error wrapping ErrSkipped
// for services a proxy does not handle, and an error naming the field for
// values it cannot parse.
func Translate(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) (servicelb.Service, error) {
	out := servicelb.Service{Name: svc.Namespace + "/" + svc.Name}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return out, fmt.Errorf("ExternalName service: %w", ErrSkipped)
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		return out, fmt.Errorf("headless service: %w", ErrSkipped)
	}
	var errs []error
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	out.ClusterIPs = parseAddrs("spec.clusterIPs", ips, &errs)
	out.ExternalIPs = parseAddrs("spec.externalIPs", svc.Spec.ExternalIPs, &errs)
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		var lb []string
		var proxied []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			// An ingress in Proxy mode is a load balancer that proxies
			// to the nodes: its address is not captured on the node.
			// (kube-proxy captures no address of a mode it does not
			// know either.)
			switch {
			case in.IP == "":
			case in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP:
				lb = append(lb, in.IP)
			default:
				proxied = append(proxied, in.IP)
			}
		}
		out.LoadBalancerIPs = parseAddrs("status.loadBalancer.ingress", lb, &errs)
		out.ProxiedLoadBalancerIPs = parseAddrs("status.loadBalancer.ingress", proxied, &errs)
		out.SourceRanges = parsePrefixes(svc.Spec.LoadBalancerSourceRanges, &errs)
		out.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
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
	out.Endpoints = endpoints(slices, &errs)
	return out, errors.Join(errs...)
}

func parseAddrs(field string, in []string, errs *[]error) []netip.Addr {
	var out []netip.Addr
	for i, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil {
			*errs = append(*errs, fmt.Errorf("%s[%d]: %w", field, i, err))
			continue
		}
		out = append(out, a)
	}
	return out
}

// parsePrefixes parses source ranges as kube-proxy does: surrounding
// spaces are ignored and host bits cleared.
func parsePrefixes(in []string, errs *[]error) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range in {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			*errs = append(*errs, fmt.Errorf("spec.loadBalancerSourceRanges[%d]: %w", i, err))
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}

// endpoints translates the endpoints of the slices: the first address of
// each, serving exactly the slice's ports, by name. FQDN slices are
// ignored.
func endpoints(slices []*discoveryv1.EndpointSlice, errs *[]error) []servicelb.Endpoint {
	var out []servicelb.Endpoint
	for _, sl := range slices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		ports := map[string]uint16{}
		for _, p := range sl.Ports {
			if p.Port != nil {
				ports[deref(p.Name)] = uint16(*p.Port)
			}
		}
		for i, e := range sl.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(e.Addresses[0])
			if err != nil {
				*errs = append(*errs, fmt.Errorf("endpointslice %s: endpoints[%d].addresses[0]: %w", sl.Name, i, err))
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
