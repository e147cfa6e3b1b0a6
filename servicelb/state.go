package servicelb

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
)

// State is a validated desired state: a node and its services, each
// compiled into service ports with their selected backends. A State is
// immutable and safe for concurrent use; States made from one another share
// every service that did not change, so Diff finds changes by identity.
type State struct {
	node NodeConfig
	svcs serviceMap
}

type entry struct {
	svc   *Service
	ports []*ServicePort
}

// NewState validates services against node and returns their State. It
// fails, returning every mistake joined, if any service is invalid or
// conflicts with another: all or nothing.
func NewState(node NodeConfig, services ...Service) (*State, error) {
	b, err := NewBuilder(node)
	if err != nil {
		return nil, err
	}
	var errs []error
	for i := range services {
		if err := b.Upsert(services[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return b.State(), nil
}

// Node returns the node the state was compiled for.
func (s *State) Node() NodeConfig { return s.node }

// Len returns the number of services.
func (s *State) Len() int { return s.svcs.n }

// Service returns the named service. The result is read only.
func (s *State) Service(name string) (*Service, bool) {
	e := s.svcs.get(name)
	if e == nil {
		return nil, false
	}
	return e.svc, true
}

// Services returns every service, ordered by name. The results are read only.
func (s *State) Services() []*Service {
	out := make([]*Service, 0, s.svcs.n)
	s.svcs.each(func(_ string, e *entry) { out = append(out, e.svc) })
	slices.SortFunc(out, func(a, b *Service) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Ports returns every service port, ordered by key.
func (s *State) Ports() []*ServicePort {
	var out []*ServicePort
	s.svcs.each(func(_ string, e *entry) { out = append(out, e.ports...) })
	slices.SortFunc(out, func(a, b *ServicePort) int { return a.Key.Compare(b.Key) })
	return out
}

// ServicePorts returns the ports of the named service.
func (s *State) ServicePorts(name string) []*ServicePort {
	if e := s.svcs.get(name); e != nil {
		return slices.Clone(e.ports)
	}
	return nil
}

// Port returns the service port with key k, or nil.
func (s *State) Port(k ServicePortKey) *ServicePort {
	if e := s.svcs.get(k.Service); e != nil {
		for _, p := range e.ports {
			if p.Key == k {
				return p
			}
		}
	}
	return nil
}

// Edit returns a Builder that starts from s. s itself does not change.
// Edit costs a walk of every service (to index their addresses); a Builder
// kept across changes, as a Runner keeps one, does not.
func (s *State) Edit() *Builder {
	b := &Builder{node: s.node, w: mapWriter{serviceMap: s.svcs}}
	b.w.share()
	b.index()
	return b
}

// Builder assembles a State one service at a time, validating each change
// against the services already in it. It is not safe for concurrent use.
type Builder struct {
	node NodeConfig
	w    mapWriter
	// vips and nodePorts map each virtual address and node port in use to
	// the service using it.
	vips      map[vipKey]string
	nodePorts map[portKey]string
	snapshot  *State
}

type vipKey struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

type portKey struct {
	proto Protocol
	port  uint16
}

// NewBuilder returns an empty Builder for node.
func NewBuilder(node NodeConfig) (*Builder, error) {
	if err := ValidateNode(&node); err != nil {
		return nil, err
	}
	node = cloneNode(node)
	b := &Builder{node: node, w: newMapWriter()}
	b.index()
	return b, nil
}

func (b *Builder) index() {
	b.vips, b.nodePorts = map[vipKey]string{}, map[portKey]string{}
	b.w.each(func(name string, e *entry) {
		vips, nps := keysOf(e.svc)
		for _, k := range vips {
			b.vips[k] = name
		}
		for _, k := range nps {
			b.nodePorts[k] = name
		}
	})
}

// keysOf returns the virtual address and node port keys a service uses.
func keysOf(s *Service) ([]vipKey, []portKey) {
	var vips []vipKey
	var nps []portKey
	for _, p := range s.Ports {
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			vips = append(vips, vipKey{a, p.Protocol, p.Port})
		}
		if p.NodePort != 0 {
			nps = append(nps, portKey{p.Protocol, p.NodePort})
		}
	}
	if s.HealthCheckNodePort != 0 {
		nps = append(nps, portKey{TCP, s.HealthCheckNodePort})
	}
	return vips, nps
}

// Len returns the number of services.
func (b *Builder) Len() int { return b.w.n }

// Has reports whether the named service is present.
func (b *Builder) Has(name string) bool { return b.w.get(name) != nil }

// Upsert validates s and adds it, or replaces the service of the same name.
// On error nothing changes. Upserting a service equal to the present one
// changes nothing, so Diff does not report it.
func (b *Builder) Upsert(s Service) error {
	_, err := b.upsert(s)
	return err
}

// upsert is Upsert, also reporting whether anything changed.
func (b *Builder) upsert(s Service) (bool, error) {
	if err := Validate(&b.node, &s); err != nil {
		return false, err
	}
	n := normalize(s)
	old := b.w.get(n.Name)
	ok := old != nil
	if ok && reflect.DeepEqual(old.svc, n) {
		return false, nil
	}
	if err := b.conflicts(n); err != nil {
		return false, err
	}
	b.snapshot = nil
	if ok {
		b.unindex(old.svc)
	}
	b.w.set(n.Name, &entry{svc: n, ports: compilePorts(&b.node, n)})
	vips, nps := keysOf(n)
	for _, k := range vips {
		b.vips[k] = n.Name
	}
	for _, k := range nps {
		b.nodePorts[k] = n.Name
	}
	return true, nil
}

func (b *Builder) conflicts(s *Service) error {
	var errs []error
	clash := func(field, value string, kind error, other string) {
		if other != "" && other != s.Name {
			errs = append(errs, invalidf(s.Name, field, value, kind, "used by %q", other))
		}
	}
	for i, p := range s.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			v := fmt.Sprintf("%s/%s", netip.AddrPortFrom(a, p.Port), p.Protocol)
			clash(f, v, ErrVIPConflict, b.vips[vipKey{a, p.Protocol, p.Port}])
		}
		if p.NodePort != 0 {
			v := fmt.Sprintf("%d/%s", p.NodePort, p.Protocol)
			clash(f+".nodePort", v, ErrNodePortConflict, b.nodePorts[portKey{p.Protocol, p.NodePort}])
		}
	}
	if hc := s.HealthCheckNodePort; hc != 0 {
		clash("healthCheckNodePort", fmt.Sprint(hc), ErrNodePortConflict, b.nodePorts[portKey{TCP, hc}])
	}
	return errors.Join(errs...)
}

func (b *Builder) unindex(s *Service) {
	vips, nps := keysOf(s)
	for _, k := range vips {
		delete(b.vips, k)
	}
	for _, k := range nps {
		delete(b.nodePorts, k)
	}
}

// Delete removes the named service and reports whether it was present.
func (b *Builder) Delete(name string) bool {
	e := b.w.get(name)
	if e == nil {
		return false
	}
	b.snapshot = nil
	b.unindex(e.svc)
	b.w.set(name, nil)
	return true
}

// SetNode changes the node and recompiles every service for it. If the
// node is invalid, or a service is not valid on it, nothing changes.
func (b *Builder) SetNode(node NodeConfig) error {
	if err := ValidateNode(&node); err != nil {
		return err
	}
	node = cloneNode(node)
	var errs []error
	b.w.each(func(_ string, e *entry) {
		if err := Validate(&node, e.svc); err != nil {
			errs = append(errs, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.node = node
	next := newMapWriter()
	b.w.each(func(name string, e *entry) {
		next.set(name, &entry{svc: e.svc, ports: compilePorts(&b.node, e.svc)})
	})
	b.w, b.snapshot = next, nil
	return nil
}

// State returns the current state. It costs nothing while the Builder is
// unchanged, and the changes after it cost about the square root of the
// number of services each, not a copy of them all.
func (b *Builder) State() *State {
	if b.snapshot == nil {
		b.snapshot = &State{node: b.node, svcs: b.w.serviceMap}
		b.w.share()
	}
	return b.snapshot
}

// normalize returns a deep copy of a valid service with defaults applied.
func normalize(s Service) *Service {
	n := s
	n.ClusterIPs = slices.Clone(s.ClusterIPs)
	n.ExternalIPs = slices.Clone(s.ExternalIPs)
	n.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	n.SourceRanges = slices.Clone(s.SourceRanges)
	n.Ports = slices.Clone(s.Ports)
	n.InternalTrafficPolicy = cmp.Or(s.InternalTrafficPolicy, PolicyCluster)
	n.ExternalTrafficPolicy = cmp.Or(s.ExternalTrafficPolicy, PolicyCluster)
	if n.Affinity.ClientIP {
		n.Affinity.Timeout = cmp.Or(n.Affinity.Timeout, DefaultAffinityTimeout)
	}
	n.Endpoints = slices.Clone(s.Endpoints)
	for i := range n.Endpoints {
		e := &n.Endpoints[i]
		e.Ports = maps.Clone(e.Ports)
		e.Hints.ForZones = slices.Clone(e.Hints.ForZones)
		e.Hints.ForNodes = slices.Clone(e.Hints.ForNodes)
		if e.Weight != nil {
			e.Weight = Weight(*e.Weight)
		}
	}
	return &n
}

func cloneNode(n NodeConfig) NodeConfig {
	n.NodeIPs = slices.Clone(n.NodeIPs)
	n.NodePortAddresses = slices.Clone(n.NodePortAddresses)
	n.ClusterCIDRs = slices.Clone(n.ClusterCIDRs)
	n.ServiceCIDRs = slices.Clone(n.ServiceCIDRs)
	return n
}
