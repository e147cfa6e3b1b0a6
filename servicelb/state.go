package servicelb

import (
	"cmp"
	"errors"
	"maps"
	"reflect"
	"slices"
)

// State is a validated desired state: a node and its services, each
// compiled into service ports with their selected backends. A State is
// immutable and safe for concurrent use; States made from one another share
// every service that did not change, so Diff finds changes by identity.
type State struct {
	node      NodeConfig
	svcs      serviceMap
	conflicts []Conflict
	// claims is the frontend index of the Builder that made the State,
	// and seq its count of batches (see Edit); nil in a State that holds
	// less than its Builder did (Without).
	claims *claims
	seq    uint64
	// built is set on every State a Builder makes: the zero State{} is
	// no state at all.
	built bool
}

// ErrNoState: a nil State, or the zero State{} that no Builder made. A
// Proxier refuses it rather than apply it as the empty state, which would
// remove every service from a working node.
var ErrNoState = errors.New("no state: make one with NewState or a Builder")

// Check returns ErrNoState unless s is a State made by NewState or a
// Builder (an empty one included).
func (s *State) Check() error {
	if s == nil || !s.built {
		return ErrNoState
	}
	return nil
}

type entry struct {
	// svc is the service without its endpoints, which eps holds.
	svc   *Service
	eps   []epRec
	ports []*ServicePort
}

// newEntry returns the entry of service s (normalized), compiled into
// ports, with s's endpoints in their compact form eps: it keeps s, and
// drops s's endpoints.
func newEntry(s *Service, eps []epRec, ports []*ServicePort) *entry {
	s.Endpoints = nil
	return &entry{svc: s, eps: eps, ports: ports}
}

// service returns the entry's service whole: a copy whose endpoints are
// decoded from the entry's.
func (e *entry) service() *Service {
	s := *e.svc
	s.Endpoints = decodeEndpoints(e.eps)
	return &s
}

// holds reports whether the entry holds service s (normalized) with the
// endpoints eps (s's, in their compact form).
func (e *entry) holds(s *Service, eps []epRec) bool {
	x := *s
	x.Endpoints = nil
	return reflect.DeepEqual(e.svc, &x) && endpointsEqual(e.eps, eps)
}

// NewState validates services against node and returns their State. It
// fails, returning every mistake joined, if any service is invalid or
// conflicts with another: all or nothing.
func NewState(node NodeConfig, services ...Service) (*State, error) {
	b, err := NewBuilder(node)
	if err != nil {
		return nil, err
	}
	if _, errs := b.upsertBatch(services); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return b.State(), nil
}

// Node returns the node the state was compiled for.
func (s *State) Node() NodeConfig { return s.node }

// Len returns the number of services.
func (s *State) Len() int { return s.svcs.n }

// Service returns the named service, as it was given with the defaults
// applied. The result is read only; each call decodes the service's
// endpoints anew.
func (s *State) Service(name string) (*Service, bool) {
	e := s.svcs.get(name)
	if e == nil {
		return nil, false
	}
	return e.service(), true
}

// Services returns every service, ordered by name, as Service does.
func (s *State) Services() []*Service {
	out := make([]*Service, 0, s.svcs.n)
	s.svcs.each(func(_ string, e *entry) { out = append(out, e.service()) })
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

// Conflicts returns the frontends that more than one service asks for,
// with the service that holds each, ordered by frontend. See Conflict.
func (s *State) Conflicts() []Conflict { return slices.Clone(s.conflicts) }

// Without returns s without the named services (names s lacks are
// ignored): the state a proxier holds when it leaves them out. Every other
// service stays as s compiled it, its frontends included: a frontend that
// a service left out holds is not handed to another service that asks for
// it, so that leaving a service out changes nothing else. Without costs
// O(log n) for each name, not a walk of the services, and Diff of s and
// its Without what the names left out.
func (s *State) Without(names ...string) *State {
	if !slices.ContainsFunc(names, func(name string) bool { return s.svcs.get(name) != nil }) {
		return s
	}
	m := s.svcs
	for _, name := range names {
		m.delete(nil, name) // no owner: every node it changes is copied
	}
	// The index of claims still holds the services left out: an Edit
	// indexes anew.
	out := *s
	out.svcs, out.claims = m, nil
	return &out
}

// Edit returns a Builder that starts from s. s itself does not change.
// The Builder counts the claims of frontends s holds as made together
// (see Conflict): each frontend's holder keeps it, and the rules order the
// rest. Edit costs the conflicts of s, not a walk of every service: the
// Builder shares the services and the index of their frontends with s,
// as a Builder shares them with its States. Only a State from Without is
// indexed again, service by service.
func (s *State) Edit() *Builder {
	b := &Builder{node: s.node, w: mapWriter{serviceMap: s.svcs, o: &owner{}}}
	if s.claims == nil {
		b.index(s)
		return b
	}
	c := *s.claims
	c.share()
	// Every claim s holds was made before the new epoch, and every
	// claim of the Builder after it.
	c.epoch = s.seq + 1
	b.claims, b.seq = &c, c.epoch
	b.clashes = make(conflictSet, len(s.conflicts))
	for _, x := range s.conflicts {
		b.clashes[x.Frontend] = x
	}
	return b
}

// Builder assembles a State one service at a time, validating each change.
// It is not safe for concurrent use.
type Builder struct {
	node NodeConfig
	w    mapWriter
	// caps, when set, are the capabilities every service must fit.
	caps *Capabilities
	// claims index the frontends every service asks for; clashes are the
	// frontends more than one asks for. seq counts the batches of changes,
	// to order claims by when they were made.
	claims  *claims
	clashes conflictSet
	seq     uint64
	// clashVer counts the changes of the clashes.
	clashVer uint64
	snapshot *State
}

// NewBuilder returns an empty Builder for node.
func NewBuilder(node NodeConfig) (*Builder, error) {
	if err := ValidateNode(&node); err != nil {
		return nil, err
	}
	node = cloneNode(node)
	b := &Builder{node: node, w: newMapWriter()}
	b.index(nil)
	return b, nil
}

// index indexes the claims of the services present: each frontend a
// service holds as if it had claimed it before any other. A service holds
// the frontends its ports serve, and those that from's conflicts (if from
// is not nil) give it: a node port whose every node address is another
// service's serves nothing, and is still its holder's.
func (b *Builder) index(from *State) {
	b.claims, b.clashes, b.seq = newClaims(), conflictSet{}, 1
	var winners map[string]string
	if from != nil {
		winners = make(map[string]string, len(from.conflicts))
		for _, c := range from.conflicts {
			winners[c.Frontend] = c.Winner
		}
	}
	b.w.each(func(_ string, e *entry) {
		held := heldClaims(e)
		b.claims.add(e.svc, func(k claimKey) uint64 {
			if held[k] || winners[k.frontend()] == e.svc.Name {
				return 0
			}
			return 1
		})
	})
	b.allClashes()
}

// heldClaims returns the frontends a service's compiled ports serve.
func heldClaims(e *entry) map[claimKey]bool {
	out := map[claimKey]bool{}
	for _, sp := range e.ports {
		p := sp.Port
		for _, f := range sp.Frontends() {
			if f.Kind != NodePortFrontend {
				out[claimKey{vip: frontKey{f.Addr, p.Protocol, p.Port}}] = true
			}
		}
		if len(sp.NodeIPs) > 0 {
			out[claimKey{np: portKey{p.Protocol, p.NodePort}, isNP: true}] = true
		}
		if hc := sp.HealthCheckNodePort; hc != 0 {
			out[claimKey{np: portKey{TCP, hc}, isNP: true, health: true}] = true
		}
	}
	return out
}

// allClashes recomputes every clash.
func (b *Builder) allClashes() {
	b.clashes = conflictSet{}
	var vips []frontKey
	var nps []portKey
	b.claims.vips.each(func(k frontKey, _ claimList) { vips = append(vips, k) })
	b.claims.nodePorts.each(func(k portKey, _ claimList) { nps = append(nps, k) })
	b.clashes.update(b.claims, &b.node, vips, nps)
	b.clashVer++
}

// Require makes the node and every service of the Builder, present and
// future, fit the capabilities c (Capabilities.CheckNode, CheckService and
// CheckPort). It fails, changing nothing, when the node or a present
// service does not fit.
func (b *Builder) Require(c Capabilities) error {
	errs := []error{c.CheckNode(&b.node)}
	b.w.each(func(_ string, e *entry) {
		if err := checkFits(&c, e); err != nil {
			errs = append(errs, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.caps = &c
	return nil
}

func checkFits(c *Capabilities, e *entry) error {
	if err := c.CheckService(e.svc); err != nil {
		return err
	}
	var errs []error
	for _, sp := range e.ports {
		errs = append(errs, c.CheckPort(sp))
	}
	return errors.Join(errs...)
}

// Len returns the number of services.
func (b *Builder) Len() int { return b.w.n }

// Conflicts returns the frontends more than one service asks for, as
// State.Conflicts does.
func (b *Builder) Conflicts() []Conflict { return b.clashes.sorted() }

// Has reports whether the named service is present.
func (b *Builder) Has(name string) bool { return b.w.get(name) != nil }

// Upsert validates s and adds it, or replaces the service of the same name.
// On error nothing changes. Upserting a service equal to the present one
// changes nothing, so Diff does not report it. A frontend s shares with
// another service goes to one of them (see Conflict): the other service
// may change too.
func (b *Builder) Upsert(s Service) error {
	b.seq++
	_, err := b.upsert(s)
	return err
}

// upsertBatch upserts services that arrive together: their claims count
// as made at once. It returns every service that changed and the errors
// of those it refused.
func (b *Builder) upsertBatch(svcs []Service) ([]string, []error) {
	b.seq++
	var changed []string
	var errs []error
	for i := range svcs {
		names, err := b.upsert(svcs[i])
		if err != nil {
			errs = append(errs, err)
		}
		changed = append(changed, names...)
	}
	return changed, errs
}

// upsert is Upsert, also returning the names of the services that changed.
func (b *Builder) upsert(s Service) ([]string, error) {
	s = WithDefaults(s)
	if err := Validate(&b.node, &s); err != nil {
		return nil, err
	}
	n := normalize(s)
	eps := encodeEndpoints(n.Endpoints)
	old := b.w.get(n.Name)
	if old != nil && old.holds(n, eps) {
		return nil, nil
	}
	if b.caps != nil {
		if err := b.caps.CheckService(n); err != nil {
			return nil, err
		}
	}
	var oldSvc *Service
	var seqs map[claimKey]uint64
	// A service that asks for the frontends it asked for (an endpoint
	// changed, say) keeps its claims as they are: taken away and made
	// again with the same seqs, they would land where they were.
	same := false
	if old != nil {
		oldSvc = old.svc
		same = slices.Equal(serviceClaims(oldSvc), serviceClaims(n))
		if !same {
			seqs = b.claims.seqs(oldSvc)
			b.claims.remove(oldSvc)
		}
	}
	seqOf := func(k claimKey) uint64 {
		if s, ok := seqs[k]; ok {
			return s
		}
		return b.seq
	}
	if !same {
		b.claims.add(n, seqOf)
	}
	e := newEntry(n, eps, compilePorts(&b.node, n, b.claims))
	if b.caps != nil {
		if err := checkFits(b.caps, e); err != nil {
			if !same {
				b.claims.remove(n)
				if oldSvc != nil {
					b.claims.add(oldSvc, seqOf)
				}
			}
			return nil, err
		}
	}
	b.snapshot = nil
	b.w.set(n.Name, e)
	return append([]string{n.Name}, b.settle(n, oldSvc)...), nil
}

// settle recompiles the services whose share of the frontends changed with
// s (from old), and the clashes there, and returns the services that
// changed.
func (b *Builder) settle(s, old *Service) []string {
	var changed []string
	ref := s
	if ref == nil {
		ref = old
	}
	for _, name := range b.claims.affected(&b.node, ref, old) {
		e := b.w.get(name)
		if e == nil {
			continue
		}
		ports := compilePorts(&b.node, e.service(), b.claims)
		if !reflect.DeepEqual(ports, e.ports) {
			b.w.set(name, &entry{svc: e.svc, eps: e.eps, ports: ports})
			changed = append(changed, name)
		}
	}
	vips, nps := b.claims.touched(&b.node, ref, old)
	if b.clashes.update(b.claims, &b.node, vips, nps) {
		b.clashVer++
	}
	return changed
}

// Delete removes the named service and reports whether it was present.
func (b *Builder) Delete(name string) bool {
	_, ok := b.delete(name)
	return ok
}

// delete is Delete, also returning the other services that changed.
func (b *Builder) delete(name string) ([]string, bool) {
	e := b.w.get(name)
	if e == nil {
		return nil, false
	}
	b.snapshot = nil
	b.claims.remove(e.svc)
	b.w.set(name, nil)
	return b.settle(nil, e.svc), true
}

// SetNode changes the node and recompiles every service for it. If the
// node is invalid or does not fit the required capabilities, or a service
// is not valid on it, nothing changes.
func (b *Builder) SetNode(node NodeConfig) error {
	if err := ValidateNode(&node); err != nil {
		return err
	}
	if b.caps != nil {
		if err := b.caps.CheckNode(&node); err != nil {
			return err
		}
	}
	node = cloneNode(node)
	var errs []error
	b.w.each(func(_ string, e *entry) {
		if err := Validate(&node, e.service()); err != nil {
			errs = append(errs, err)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	b.node = node
	next := newMapWriter()
	b.w.each(func(name string, e *entry) {
		next.set(name, &entry{svc: e.svc, eps: e.eps, ports: compilePorts(&b.node, e.service(), b.claims)})
	})
	b.w, b.snapshot = next, nil
	b.allClashes()
	return nil
}

// State returns the current state. It costs nothing but the sorted
// conflicts, and each change after it copies the O(log n) nodes of the
// index it changes, not the services.
func (b *Builder) State() *State {
	if b.snapshot == nil {
		c := *b.claims
		b.snapshot = &State{node: b.node, svcs: b.w.serviceMap, conflicts: b.clashes.sorted(), claims: &c, seq: b.seq, built: true}
		b.w.share()
		b.claims.share()
	}
	return b.snapshot
}

// normalize returns a deep copy of a valid service with defaults applied.
func normalize(s Service) *Service {
	n := s
	n.ClusterIPs = slices.Clone(s.ClusterIPs)
	n.ExternalIPs = slices.Clone(s.ExternalIPs)
	n.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	n.ProxiedLoadBalancerIPs = slices.Clone(s.ProxiedLoadBalancerIPs)
	n.SourceRanges = slices.Clone(s.SourceRanges)
	n.Ports = slices.Clone(s.Ports)
	n = WithDefaults(n)
	n.Endpoints = nil
	if len(s.Endpoints) > 0 {
		n.Endpoints = slices.Clone(s.Endpoints)
	}
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
	n.LocalIPs = slices.Clone(n.LocalIPs)
	n.NodePortAddresses = slices.Clone(n.NodePortAddresses)
	n.ClusterCIDRs = slices.Clone(n.ClusterCIDRs)
	n.DetectLocal.NodeCIDRs = slices.Clone(n.DetectLocal.NodeCIDRs)
	n.ServiceCIDRs = slices.Clone(n.ServiceCIDRs)
	return n
}
