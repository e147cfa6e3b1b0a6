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
	// node that are ready and take new flows, counted once per address
	// over every port and family of the service. The node is healthy for
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
	var local []netip.Addr
	for _, sp := range e.ports {
		if sp.HealthCheckNodePort == 0 {
			continue
		}
		hc.Port = sp.HealthCheckNodePort
		for _, b := range sp.Local {
			if b.Ready {
				local = append(local, b.Addr)
			}
		}
	}
	if hc.Port == 0 {
		return HealthCheck{}, false
	}
	slices.SortFunc(local, netip.Addr.Compare)
	hc.LocalEndpoints = len(slices.Compact(local))
	return hc, true
}
