package servicelb

import (
	"cmp"
	"slices"
)

// WithDefaults returns s with the defaults of its zero fields filled in,
// as a Builder applies them before anything else sees the service. They
// are the defaults of the Go API and of servicelb's JSON encoding alike:
//
//   - Port.Protocol "" is TCP.
//   - InternalTrafficPolicy and ExternalTrafficPolicy "" are Cluster.
//   - SessionAffinity.Timeout 0 with ClientIP is DefaultAffinityTimeout.
//
// More zero values have a meaning rather than a default filled in:
// Port.TargetPort 0 is the service port, Endpoint.Weight nil is
// DefaultWeight, Endpoint.Ready nil is ready and Endpoint.Serving nil is
// as Ready says (as a Kubernetes EndpointSlice's absent conditions are;
// see Endpoint.IsReady and IsServing). s's slices are not changed: the
// ports are copied when one needs its protocol.
func WithDefaults(s Service) Service {
	cloned := false
	for i, p := range s.Ports {
		if p.Protocol == "" {
			if !cloned {
				s.Ports, cloned = slices.Clone(s.Ports), true
			}
			s.Ports[i].Protocol = TCP
		}
	}
	s.InternalTrafficPolicy = cmp.Or(s.InternalTrafficPolicy, PolicyCluster)
	s.ExternalTrafficPolicy = cmp.Or(s.ExternalTrafficPolicy, PolicyCluster)
	if s.Affinity.ClientIP {
		s.Affinity.Timeout = cmp.Or(s.Affinity.Timeout, DefaultAffinityTimeout)
	}
	return s
}
