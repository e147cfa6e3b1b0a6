package servicelb

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
)

// Frontend claims. Two services may ask for the same frontend: one address,
// protocol and port (two services listing one external IP and port, an
// external IP that is a node address on another service's node port), or
// one node port. The kernel can serve each frontend for one service only,
// so servicelb gives it to one and reports the clash (State.Conflicts);
// the other service keeps everything else, its cluster IP included. The
// service that held the frontend first keeps it, so that a service added
// by mistake never takes a working one's address; among services that
// arrive together (one NewState, one batch of a Runner's source, a State
// edited again) the rules decide, so that every node and every restart
// agree: a virtual address (cluster, external or load-balancer IP) beats a
// node port on that address, as kube-proxy's rules match service
// addresses before node ports; a node port beats a health check node
// port; then the service whose name sorts first wins.

// frontKey is a virtual address, protocol and port.
type frontKey struct {
	addr  netip.Addr
	proto Protocol
	port  uint16
}

func (k frontKey) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.addr, k.port), k.proto)
}

// portKey is a node port and protocol.
type portKey struct {
	proto Protocol
	port  uint16
}

// claim is a service's claim of a frontend: of a node port, as a node
// port or as its health check node port (TCP). seq orders claims by when
// the service first made them; claims made together share one.
type claim struct {
	name   string
	seq    uint64
	health bool
}

func compareClaims(a, b claim) int {
	if a.health != b.health {
		if a.health {
			return 1
		}
		return -1
	}
	return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.name, b.name))
}

// claimKey names one claim of a service.
type claimKey struct {
	vip    frontKey
	np     portKey
	isNP   bool
	health bool
}

// frontend names the frontend of a claim as a Conflict does.
func (k claimKey) frontend() string {
	switch {
	case !k.isNP:
		return k.vip.String()
	case k.health:
		return healthFrontend(k.np.port)
	}
	return nodePortFrontend(k.np)
}

func nodePortFrontend(k portKey) string { return fmt.Sprintf("node port %d/%s", k.port, k.proto) }

func healthFrontend(port uint16) string { return fmt.Sprintf("health check node port %d", port) }

// claims indexes every frontend claim of a Builder's services, each list
// ordered winner first. A State keeps the index of the Builder that made it,
// shared as the services are (pmap), so that a Builder editing the State
// starts from it instead of indexing every service again.
//
// A Builder that edits a State counts the claims the State holds as made
// together, as a new index of its services would: the holder of each
// frontend as if it had claimed it before any other, the rest of its
// claimants after it, ordered by the rules alone. Claims made before epoch
// are such claims: each list written before epoch is read settled so
// (claimList), and written back settled when it changes.
type claims struct {
	vips      pmap[frontKey, claimList]
	nodePorts pmap[portKey, claimList]
	epoch     uint64
	// o is the writer's right to change the index's nodes in place.
	o *owner
}

func newClaims() *claims { return &claims{o: &owner{}} }

// claimList is the claims of one frontend, and the epoch of the index that
// last wrote them. Its slice is never written in place: a State may hold it.
type claimList struct {
	cs    []claim
	epoch uint64
}

// settled returns the claims of l as an index of epoch holds them. A list
// written before epoch has not changed since, so every claim of it was
// made before epoch, and its first is the frontend's holder.
func (c *claims) settled(l claimList) []claim {
	if l.epoch >= c.epoch || len(l.cs) == 0 {
		return l.cs
	}
	out := slices.Clone(l.cs)
	for i := range out {
		out[i].seq = min(uint64(i), 1)
	}
	slices.SortStableFunc(out, compareClaims)
	return out
}

func (c *claims) vipList(k frontKey) []claim {
	l, _ := c.vips.get(k)
	return c.settled(l)
}

func (c *claims) portList(k portKey) []claim {
	l, _ := c.nodePorts.get(k)
	return c.settled(l)
}

func (c *claims) setVIP(k frontKey, cs []claim) {
	if len(cs) == 0 {
		c.vips.delete(c.o, k)
		return
	}
	c.vips.set(c.o, k, claimList{cs: cs, epoch: c.epoch})
}

func (c *claims) setPort(k portKey, cs []claim) {
	if len(cs) == 0 {
		c.nodePorts.delete(c.o, k)
		return
	}
	c.nodePorts.set(c.o, k, claimList{cs: cs, epoch: c.epoch})
}

// share marks the index as held by a State: later writes copy first.
func (c *claims) share() { c.o = &owner{} }

// vipOwner returns the service that holds a virtual address and port.
func (c *claims) vipOwner(k frontKey) string {
	if cs := c.vipList(k); len(cs) > 0 {
		return cs[0].name
	}
	return ""
}

// vipClaimed reports whether a service claims k as a virtual address.
func (c *claims) vipClaimed(k frontKey) bool {
	_, ok := c.vips.get(k)
	return ok
}

// nodePortOwner returns the service that holds a node port.
func (c *claims) nodePortOwner(k portKey) string {
	if cs := c.portList(k); len(cs) > 0 && !cs[0].health {
		return cs[0].name
	}
	return ""
}

// healthOwner returns the service that holds a health check node port.
func (c *claims) healthOwner(port uint16) string {
	if cs := c.portList(portKey{TCP, port}); len(cs) > 0 && cs[0].health {
		return cs[0].name
	}
	return ""
}

// serviceClaims returns the frontends a service claims.
func serviceClaims(s *Service) []claimKey {
	var out []claimKey
	for _, p := range s.Ports {
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			out = append(out, claimKey{vip: frontKey{a, p.Protocol, p.Port}})
		}
		if p.NodePort != 0 {
			out = append(out, claimKey{np: portKey{p.Protocol, p.NodePort}, isNP: true})
		}
	}
	if hc := s.HealthCheckNodePort; hc != 0 {
		out = append(out, claimKey{np: portKey{TCP, hc}, isNP: true, health: true})
	}
	return out
}

// seqs returns when a service made each of its claims.
func (c *claims) seqs(s *Service) map[claimKey]uint64 {
	out := map[claimKey]uint64{}
	for _, k := range serviceClaims(s) {
		var list []claim
		if k.isNP {
			list = c.portList(k.np)
		} else {
			list = c.vipList(k.vip)
		}
		for _, x := range list {
			if x.name == s.Name && x.health == k.health {
				out[k] = x.seq
			}
		}
	}
	return out
}

// add records a service's claims, each made at seq(key).
func (c *claims) add(s *Service, seq func(claimKey) uint64) {
	for _, k := range serviceClaims(s) {
		x := claim{name: s.Name, seq: seq(k), health: k.health}
		if k.isNP {
			c.setPort(k.np, insertClaim(c.portList(k.np), x))
		} else {
			c.setVIP(k.vip, insertClaim(c.vipList(k.vip), x))
		}
	}
}

// insertClaim returns cs with x in its place, in a new slice: a State may
// hold cs.
func insertClaim(cs []claim, x claim) []claim {
	if slices.ContainsFunc(cs, func(y claim) bool { return y.name == x.name && y.health == x.health }) {
		return cs
	}
	i, _ := slices.BinarySearchFunc(cs, x, compareClaims)
	return slices.Concat(cs[:i], []claim{x}, cs[i:])
}

// remove forgets a service's claims.
func (c *claims) remove(s *Service) {
	for _, k := range serviceClaims(s) {
		others := func(cs []claim) []claim {
			out := make([]claim, 0, len(cs))
			for _, x := range cs {
				if x.name != s.Name {
					out = append(out, x)
				}
			}
			return out
		}
		if k.isNP {
			c.setPort(k.np, others(c.portList(k.np)))
		} else {
			c.setVIP(k.vip, others(c.vipList(k.vip)))
		}
	}
}

// affected returns the services, other than s, whose share of the
// frontends s claims (or claimed, in old) may change when s changes: every
// other claimant of those frontends, and the holders of node ports on a
// node address s claims as a virtual address.
func (c *claims) affected(node *NodeConfig, s, old *Service) []string {
	seen := map[string]bool{}
	for _, svc := range []*Service{s, old} {
		if svc == nil {
			continue
		}
		for _, k := range serviceClaims(svc) {
			if k.isNP {
				for _, x := range c.portList(k.np) {
					seen[x.name] = true
				}
				continue
			}
			for _, x := range c.vipList(k.vip) {
				seen[x.name] = true
			}
			if slices.Contains(node.NodeIPs, k.vip.addr) {
				for _, x := range c.portList(portKey{k.vip.proto, k.vip.port}) {
					seen[x.name] = true
				}
			}
		}
	}
	delete(seen, s.Name)
	return slices.Sorted(maps.Keys(seen))
}

// ErrFrontendTaken: a service asks for a frontend another service holds;
// it is served without it (see Conflict).
var ErrFrontendTaken = errors.New("address and port already used by another service")

// Conflict is a frontend that more than one service asks for. The Winner
// holds it; the Losers are served without it.
type Conflict struct {
	// Frontend names the frontend: "192.0.2.10:80/TCP" for an address,
	// protocol and port, "node port 30080/TCP" or "health check node port
	// 30100" for a node port.
	Frontend string
	Winner   string
	Losers   []string
}

// Err returns the error a source reports for each loser: it wraps
// ErrFrontendTaken and names the frontend and its holder.
func (c Conflict) Err() error {
	return fmt.Errorf("%s: %w: held by %q", c.Frontend, ErrFrontendTaken, c.Winner)
}

// String formats the conflict for a log line.
func (c Conflict) String() string {
	return fmt.Sprintf("%s: held by %q, not served for %s", c.Frontend, c.Winner, quoteAll(c.Losers))
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// vipConflict returns the clash at a virtual address, protocol and port,
// if any: several services claim it, or it is a node address on which
// another service's node port is not served.
func (c *claims) vipConflict(node *NodeConfig, k frontKey) (Conflict, bool) {
	cs := c.vipList(k)
	if len(cs) == 0 {
		return Conflict{}, false
	}
	var losers []string
	for _, x := range cs[1:] {
		losers = append(losers, x.name)
	}
	if slices.Contains(node.NodeIPs, k.addr) {
		for _, x := range c.portList(portKey{k.proto, k.port}) {
			if !x.health && x.name != cs[0].name && !slices.Contains(losers, x.name) {
				losers = append(losers, x.name)
			}
		}
	}
	if len(losers) == 0 {
		return Conflict{}, false
	}
	return Conflict{Frontend: k.String(), Winner: cs[0].name, Losers: losers}, true
}

// portConflict returns the clash at a node port, if several services
// claim it.
func (c *claims) portConflict(k portKey) (Conflict, bool) {
	cs := c.portList(k)
	if len(cs) < 2 {
		return Conflict{}, false
	}
	what := nodePortFrontend(k)
	if cs[0].health {
		what = healthFrontend(k.port)
	}
	var losers []string
	for _, x := range cs[1:] {
		losers = append(losers, x.name)
	}
	return Conflict{Frontend: what, Winner: cs[0].name, Losers: losers}, true
}

// touched returns the frontends whose clashes a change of s (from old)
// may change: those either version claims, and the node addresses with
// the node ports either claims.
func (c *claims) touched(node *NodeConfig, s, old *Service) ([]frontKey, []portKey) {
	var vips []frontKey
	var nps []portKey
	for _, svc := range []*Service{s, old} {
		if svc == nil {
			continue
		}
		for _, k := range serviceClaims(svc) {
			if !k.isNP {
				vips = append(vips, k.vip)
				continue
			}
			nps = append(nps, k.np)
			for _, a := range node.NodeIPs {
				vips = append(vips, frontKey{a, k.np.proto, k.np.port})
			}
		}
	}
	return vips, nps
}

// conflictSet holds the current clashes by frontend name.
type conflictSet map[string]Conflict

// update recomputes the clashes at the given frontends and reports
// whether any changed.
func (cs conflictSet) update(c *claims, node *NodeConfig, vips []frontKey, nps []portKey) bool {
	changed := false
	set := func(name string, x Conflict, ok bool) {
		old, had := cs[name]
		switch {
		case ok && (!had || !reflect.DeepEqual(old, x)):
			cs[name], changed = x, true
		case !ok && had:
			delete(cs, name)
			changed = true
		}
	}
	for _, k := range vips {
		x, ok := c.vipConflict(node, k)
		set(k.String(), x, ok)
	}
	for _, k := range nps {
		x, ok := c.portConflict(k)
		np := nodePortFrontend(k)
		set(np, x, ok && x.Frontend == np)
		if k.proto == TCP { // a health check node port is TCP's
			hc := healthFrontend(k.port)
			set(hc, x, ok && x.Frontend == hc)
		}
	}
	return changed
}

// sorted returns the clashes ordered by frontend.
func (cs conflictSet) sorted() []Conflict {
	out := make([]Conflict, 0, len(cs))
	for _, x := range cs {
		out = append(out, x)
	}
	slices.SortFunc(out, func(a, b Conflict) int { return cmp.Compare(a.Frontend, b.Frontend) })
	return out
}
