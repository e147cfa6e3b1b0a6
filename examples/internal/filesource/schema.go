// Package filesource reads services from a YAML or JSON file, reports
// every mistake with the file, line and field, and feeds the services to a
// servicelb.Runner, watching the file and applying only what changed.
//
// # Schema
//
// A file holds one document with a list of services. JSON is the same
// document in JSON syntax. Field names follow servicelb's JSON names:
//
//	services:
//	  - name: default/web            # unique key, required
//	    clusterIPs: [10.96.0.10]     # at most one per family
//	    externalIPs: []              # more addresses the ports are served on
//	    loadBalancerIPs: []
//	    ports:                       # at least one
//	      - name: http               # may be empty for a single port
//	        protocol: TCP            # TCP (default), UDP or SCTP
//	        port: 80
//	        nodePort: 30080          # optional
//	        targetPort: 8080         # default: port
//	    internalTrafficPolicy: Cluster   # or Local
//	    externalTrafficPolicy: Cluster   # or Local
//	    affinity: {clientIP: true, timeout: 3h}
//	    sourceRanges: [192.0.2.0/24]
//	    healthCheckNodePort: 0
//	    scheduler: ""                # hint: rr, wrr, lc, sh, mh, random, ...
//	    endpoints:
//	      - addr: 10.100.1.2
//	        ports: {http: 8080}      # per port name; default: targetPort
//	        ready: true              # default true
//	        serving: true            # default: ready
//	        terminating: false
//	        nodeName: node-a
//	        zone: zone-a
//	        hints: {forZones: [zone-a], forNodes: []}
//	        weight: 1                # 0 drains
//
// Unknown fields are errors. See examples/static/services.yaml for a
// commented example.
package filesource

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// File is the document.
type File struct {
	Services []Service `yaml:"services"`
}

// Service is a service as written in the file.
type Service struct {
	Name                  string     `yaml:"name"`
	ClusterIPs            []string   `yaml:"clusterIPs"`
	ExternalIPs           []string   `yaml:"externalIPs"`
	LoadBalancerIPs       []string   `yaml:"loadBalancerIPs"`
	Ports                 []Port     `yaml:"ports"`
	InternalTrafficPolicy string     `yaml:"internalTrafficPolicy"`
	ExternalTrafficPolicy string     `yaml:"externalTrafficPolicy"`
	Affinity              Affinity   `yaml:"affinity"`
	SourceRanges          []string   `yaml:"sourceRanges"`
	HealthCheckNodePort   uint16     `yaml:"healthCheckNodePort"`
	Scheduler             string     `yaml:"scheduler"`
	Endpoints             []Endpoint `yaml:"endpoints"`
}

// Port is a service port as written in the file.
type Port struct {
	Name       string `yaml:"name"`
	Protocol   string `yaml:"protocol"`
	Port       uint16 `yaml:"port"`
	NodePort   uint16 `yaml:"nodePort"`
	TargetPort uint16 `yaml:"targetPort"`
}

// Affinity is session affinity as written in the file.
type Affinity struct {
	ClientIP bool          `yaml:"clientIP"`
	Timeout  time.Duration `yaml:"timeout"`
}

// Endpoint is an endpoint as written in the file.
type Endpoint struct {
	Addr        string            `yaml:"addr"`
	Ports       map[string]uint16 `yaml:"ports"`
	Ready       *bool             `yaml:"ready"`
	Serving     *bool             `yaml:"serving"`
	Terminating bool              `yaml:"terminating"`
	NodeName    string            `yaml:"nodeName"`
	Zone        string            `yaml:"zone"`
	Hints       Hints             `yaml:"hints"`
	Weight      *uint16           `yaml:"weight"`
}

// Hints are topology hints as written in the file.
type Hints struct {
	ForZones []string `yaml:"forZones"`
	ForNodes []string `yaml:"forNodes"`
}

// fieldError is a mistake at a field path inside one service, such as
// "endpoints[2].addr".
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// Convert turns a file service into a servicelb.Service. Addresses that do
// not parse are returned as *fieldError values naming the field; the
// service's own rules are checked later by servicelb.
func (s *Service) Convert() (servicelb.Service, error) {
	var errs []error
	addrs := func(field string, in []string) []netip.Addr {
		var out []netip.Addr
		for i, a := range in {
			v, err := netip.ParseAddr(a)
			if err != nil {
				errs = append(errs, &fieldError{fmt.Sprintf("%s[%d]", field, i), err})
				continue
			}
			out = append(out, v)
		}
		return out
	}
	out := servicelb.Service{
		Name:                  s.Name,
		ClusterIPs:            addrs("clusterIPs", s.ClusterIPs),
		ExternalIPs:           addrs("externalIPs", s.ExternalIPs),
		LoadBalancerIPs:       addrs("loadBalancerIPs", s.LoadBalancerIPs),
		InternalTrafficPolicy: servicelb.TrafficPolicy(s.InternalTrafficPolicy),
		ExternalTrafficPolicy: servicelb.TrafficPolicy(s.ExternalTrafficPolicy),
		Affinity:              servicelb.SessionAffinity{ClientIP: s.Affinity.ClientIP, Timeout: s.Affinity.Timeout},
		HealthCheckNodePort:   s.HealthCheckNodePort,
		Scheduler:             servicelb.Scheduler(s.Scheduler),
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, servicelb.Port{
			Name: p.Name, Protocol: servicelb.Protocol(cmp.Or(p.Protocol, "TCP")),
			Port: p.Port, NodePort: p.NodePort, TargetPort: p.TargetPort,
		})
	}
	for i, r := range s.SourceRanges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			errs = append(errs, &fieldError{fmt.Sprintf("sourceRanges[%d]", i), err})
			continue
		}
		out.SourceRanges = append(out.SourceRanges, p)
	}
	for i := range s.Endpoints {
		e, err := s.Endpoints[i].convert()
		if err != nil {
			errs = append(errs, &fieldError{fmt.Sprintf("endpoints[%d].addr", i), err})
			continue
		}
		out.Endpoints = append(out.Endpoints, e)
	}
	return out, errors.Join(errs...)
}

func (e *Endpoint) convert() (servicelb.Endpoint, error) {
	a, err := netip.ParseAddr(e.Addr)
	if err != nil {
		return servicelb.Endpoint{}, err
	}
	ready := e.Ready == nil || *e.Ready
	serving := ready
	if e.Serving != nil {
		serving = *e.Serving
	}
	return servicelb.Endpoint{
		Addr: a, Ports: e.Ports, Ready: ready, Serving: serving, Terminating: e.Terminating,
		NodeName: e.NodeName, Zone: e.Zone, Weight: e.Weight,
		Hints: servicelb.Hints{ForZones: e.Hints.ForZones, ForNodes: e.Hints.ForNodes},
	}, nil
}
