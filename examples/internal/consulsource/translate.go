// Package consulsource feeds a servicelb.Runner from Consul: blocking
// queries on the catalog's service list and on each service's health.
// An instance whose checks pass is ready; a critical one is not; a warning
// one is ready only when configured so; a deregistered one is gone.
//
// Consul services have no virtual address, so each load-balanced service
// takes its VIP, port and protocol from a mapping file or from the service
// meta of its instances (keys MetaVIP, MetaPort, MetaProtocol,
// MetaNodePort). Services with neither are not load-balanced. The servicelb
// service is named "consul/<name>".
package consulsource

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"

	"github.com/hashicorp/consul/api"
	"go.yaml.in/yaml/v3"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Service meta keys that give a service its virtual address.
const (
	MetaVIP      = "kproxy-vip"
	MetaPort     = "kproxy-port"
	MetaProtocol = "kproxy-protocol"
	MetaNodePort = "kproxy-node-port"
)

// NamePrefix starts the servicelb name of every Consul service.
const NamePrefix = "consul/"

// ErrNoVIP marks a service with no VIP in the mapping or its meta: it is
// not load-balanced, which is not a mistake.
var ErrNoVIP = errors.New("no VIP in the mapping file or the service meta")

// Mapping is where a Consul service is served.
type Mapping struct {
	// VIP is the virtual address.
	VIP string `yaml:"vip"`
	// Port is the port on the VIP; default: the instances' port.
	Port uint16 `yaml:"port"`
	// Protocol is TCP (default), UDP or SCTP.
	Protocol string `yaml:"protocol"`
	// NodePort, when set, also serves the service on the node's addresses.
	NodePort uint16 `yaml:"nodePort"`
}

// MappingFile is the mapping file's document:
//
//	services:
//	  web: {vip: 10.96.0.20, port: 80}
//	  dns: {vip: 10.96.0.53, port: 53, protocol: UDP}
type MappingFile struct {
	Services map[string]Mapping `yaml:"services"`
}

// LoadMapping reads a mapping file; unknown fields are errors.
func LoadMapping(path string) (map[string]Mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mapping file: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var m MappingFile
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("mapping file %s: %w", path, err)
	}
	return m.Services, nil
}

// Options shape the translation.
type Options struct {
	// Mapping gives services their VIP; it wins over service meta.
	Mapping map[string]Mapping
	// WarningReady makes instances whose worst check is warning ready.
	WarningReady bool
}

// Translate turns the health entries of the Consul service name into a
// servicelb service. It returns an error wrapping ErrNoVIP for a service
// that is not load-balanced, and an error naming the problem for a mapping
// or meta it cannot use.
func Translate(name string, entries []*api.ServiceEntry, o Options) (servicelb.Service, error) {
	out := servicelb.Service{Name: NamePrefix + name}
	m, ok := o.Mapping[name]
	if !ok {
		var err error
		if m, err = metaMapping(entries); err != nil {
			return out, err
		}
	}
	vip, err := netip.ParseAddr(m.VIP)
	if err != nil {
		return out, fmt.Errorf("vip %q: %w", m.VIP, err)
	}
	port := m.Port
	if port == 0 {
		if port, err = commonPort(entries); err != nil {
			return out, err
		}
	}
	out.ClusterIPs = []netip.Addr{vip}
	out.Ports = []servicelb.Port{{Protocol: servicelb.Protocol(cmp.Or(m.Protocol, "TCP")), Port: port, NodePort: m.NodePort}}
	for _, e := range entries {
		ep, err := endpoint(e, o.WarningReady)
		if err != nil {
			return out, err
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out, nil
}

// metaMapping reads the mapping from the instances' meta, which must agree.
func metaMapping(entries []*api.ServiceEntry) (Mapping, error) {
	var m Mapping
	var from string
	for _, e := range entries {
		meta := e.Service.Meta
		if meta[MetaVIP] == "" {
			continue
		}
		cur := Mapping{VIP: meta[MetaVIP], Protocol: meta[MetaProtocol]}
		for _, f := range []struct {
			key string
			dst *uint16
		}{{MetaPort, &cur.Port}, {MetaNodePort, &cur.NodePort}} {
			if v := meta[f.key]; v != "" {
				n, err := strconv.ParseUint(v, 10, 16)
				if err != nil {
					return m, fmt.Errorf("instance %s: meta %s %q: %w", e.Service.ID, f.key, v, err)
				}
				*f.dst = uint16(n)
			}
		}
		if from != "" && cur != m {
			return m, fmt.Errorf("instances %s and %s disagree on the meta %s/%s/%s/%s", from, e.Service.ID,
				MetaVIP, MetaPort, MetaProtocol, MetaNodePort)
		}
		m, from = cur, e.Service.ID
	}
	if from == "" {
		return m, ErrNoVIP
	}
	return m, nil
}

func commonPort(entries []*api.ServiceEntry) (uint16, error) {
	var ports []int
	for _, e := range entries {
		ports = append(ports, e.Service.Port)
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	if len(ports) != 1 || ports[0] <= 0 || ports[0] > 65535 {
		return 0, fmt.Errorf("no port in the mapping or meta %s, and the instances' ports %v are not one port", MetaPort, ports)
	}
	return uint16(ports[0]), nil
}

func endpoint(e *api.ServiceEntry, warningReady bool) (servicelb.Endpoint, error) {
	addr := e.Service.Address
	if addr == "" && e.Node != nil {
		addr = e.Node.Address
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return servicelb.Endpoint{}, fmt.Errorf("instance %s: address %q: %w", e.Service.ID, addr, err)
	}
	if e.Service.Port <= 0 || e.Service.Port > 65535 {
		return servicelb.Endpoint{}, fmt.Errorf("instance %s: port %d", e.Service.ID, e.Service.Port)
	}
	var ready bool
	switch e.Checks.AggregatedStatus() {
	case api.HealthPassing:
		ready = true
	case api.HealthWarning:
		ready = warningReady
	}
	ep := servicelb.Endpoint{Addr: a, Ports: map[string]uint16{"": uint16(e.Service.Port)}}
	if !ready {
		ep.Ready = new(false) // nil: ready
	}
	if e.Node != nil {
		ep.NodeName = e.Node.Node
	}
	return ep, nil
}
