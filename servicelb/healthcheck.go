package servicelb

import (
	"cmp"
	"net/netip"
	"slices"
)

// HealthCheck is what a service's health check node port tells a load
// balancer about this node: whether to send it the service's traffic. A
// load balancer in front of a service with the external Local policy
// probes the port on every node and sends traffic only to the nodes that
// answer healthy, since the others drop it (package healthcheck serves
// it).
type HealthCheck struct {
	// Service is the service's name.
	Service string
	// Port is the service's health check node port (TCP).
	Port uint16
	// LocalEndpoints is the number of the service's endpoints on this
	// node that are ready and take new flows, counted as kube-proxy
	// counts them: once per address and target port over every port of
	// the service, in one family (the family with more, where they
	// differ: kube-proxy reports the count of whichever of its proxiers
	// synced last). The node is healthy for
	// the service while it is above zero. An endpoint that still serves
	// while terminating does not count, although the node keeps sending
	// it what arrives when no endpoint is ready, so that a load balancer
	// drains a node whose endpoints are all going away; a drained one
	// (weight 0) does not count either.
	LocalEndpoints int
}

// HealthCheck returns the health check of the named service, and false
// when the service has no health check node port, or another service
// holds that port (see Conflicts).
func (s *State) HealthCheck(name string) (HealthCheck, bool) {
	e := s.svcs.get(name)
	if e == nil {
		return HealthCheck{}, false
	}
	return e.healthCheck()
}

// HealthChecks returns the health check of every service that holds a
// health check node port, ordered by service.
func (s *State) HealthChecks() []HealthCheck {
	var out []HealthCheck
	s.svcs.each(func(_ string, e *entry) {
		if hc, ok := e.healthCheck(); ok {
			out = append(out, hc)
		}
	})
	slices.SortFunc(out, func(a, b HealthCheck) int { return cmp.Compare(a.Service, b.Service) })
	return out
}

func (e *entry) healthCheck() (HealthCheck, bool) {
	hc := HealthCheck{Service: e.svc.Name}
	var local [2][]netip.AddrPort // by family
	for _, sp := range e.ports {
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		hc.Port = sp.HealthCheckNodePort
		f := 0
		if sp.Key.Family == IPv6 {
			f = 1
		}
		for _, b := range sp.Local {
			if b.Ready {
				local[f] = append(local[f], b.AddrPort())
			}
		}
	}
	if hc.Port == 0 {
		return HealthCheck{}, false
	}
	for _, l := range local {
		slices.SortFunc(l, netip.AddrPort.Compare)
		hc.LocalEndpoints = max(hc.LocalEndpoints, len(slices.Compact(l)))
	}
	return hc, true
}
