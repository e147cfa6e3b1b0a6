package servicelb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Frontend claims. Two services may ask for the same frontend: one address,
// protocol and port (two services listing one external IP and port, an
// external IP that is a node address on another service's node port), or
// one node port. The kernel can serve each frontend for one service only,
// so servicelb gives it to one and reports the clash (State.Conflicts);
// the other service keeps everything else, its cluster IP included. The
// winner is decided by rule, not by arrival order, so that every node and
// every restart agree: a virtual address (cluster, external or
// load-balancer IP) beats a node port on that address, as kube-proxy's
// rules match service addresses before node ports; a node port beats a
// health check node port; among claims of one kind the service whose name
// sorts first wins.

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

// claim is a service's claim of a node port: as a node port or as its
// health check node port (TCP).
type claim struct {
	name   string
	health bool
}

func compareClaims(a, b claim) int {
	if a.health != b.health {
		if a.health {
			return 1
		}
		return -1
	}
	return cmp.Compare(a.name, b.name)
}

// claims indexes every frontend claim of a Builder's services, each list
// ordered winner first.
type claims struct {
	vips      map[frontKey][]string
	nodePorts map[portKey][]claim
}

func newClaims() *claims {
	return &claims{vips: map[frontKey][]string{}, nodePorts: map[portKey][]claim{}}
}

// vipOwner returns the service that holds a virtual address and port.
func (c *claims) vipOwner(k frontKey) string {
	if names := c.vips[k]; len(names) > 0 {
		return names[0]
	}
	return ""
}

// vipClaimed reports whether a service claims k as a virtual address.
func (c *claims) vipClaimed(k frontKey) bool { return len(c.vips[k]) > 0 }

// nodePortOwner returns the service that holds a node port.
func (c *claims) nodePortOwner(k portKey) string {
	if cs := c.nodePorts[k]; len(cs) > 0 && !cs[0].health {
		return cs[0].name
	}
	return ""
}

// healthOwner returns the service that holds a health check node port.
func (c *claims) healthOwner(port uint16) string {
	if cs := c.nodePorts[portKey{TCP, port}]; len(cs) > 0 && cs[0].health {
		return cs[0].name
	}
	return ""
}

// serviceClaims returns the frontends a service claims.
func serviceClaims(s *Service) ([]frontKey, []portKey, []claim) {
	var vips []frontKey
	var nps []portKey
	var kinds []claim
	for _, p := range s.Ports {
		for _, a := range slices.Concat(s.ClusterIPs, s.ExternalIPs, s.LoadBalancerIPs) {
			vips = append(vips, frontKey{a, p.Protocol, p.Port})
		}
		if p.NodePort != 0 {
			nps = append(nps, portKey{p.Protocol, p.NodePort})
			kinds = append(kinds, claim{name: s.Name})
		}
	}
	if hc := s.HealthCheckNodePort; hc != 0 {
		nps = append(nps, portKey{TCP, hc})
		kinds = append(kinds, claim{name: s.Name, health: true})
	}
	return vips, nps, kinds
}

// add records a service's claims.
func (c *claims) add(s *Service) {
	vips, nps, kinds := serviceClaims(s)
	for _, k := range vips {
		names := c.vips[k]
		if i, found := slices.BinarySearch(names, s.Name); !found {
			c.vips[k] = slices.Insert(names, i, s.Name)
		}
	}
	for i, k := range nps {
		cs := c.nodePorts[k]
		if j, found := slices.BinarySearchFunc(cs, kinds[i], compareClaims); !found {
			c.nodePorts[k] = slices.Insert(cs, j, kinds[i])
		}
	}
}

// remove forgets a service's claims.
func (c *claims) remove(s *Service) {
	vips, nps, _ := serviceClaims(s)
	for _, k := range vips {
		names := slices.DeleteFunc(c.vips[k], func(n string) bool { return n == s.Name })
		if len(names) == 0 {
			delete(c.vips, k)
		} else {
			c.vips[k] = names
		}
	}
	for _, k := range nps {
		cs := slices.DeleteFunc(c.nodePorts[k], func(x claim) bool { return x.name == s.Name })
		if len(cs) == 0 {
			delete(c.nodePorts, k)
		} else {
			c.nodePorts[k] = cs
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
		vips, nps, _ := serviceClaims(svc)
		for _, k := range vips {
			for _, n := range c.vips[k] {
				seen[n] = true
			}
			if slices.Contains(node.NodeIPs, k.addr) {
				for _, x := range c.nodePorts[portKey{k.proto, k.port}] {
					seen[x.name] = true
				}
			}
		}
		for _, k := range nps {
			for _, x := range c.nodePorts[k] {
				seen[x.name] = true
			}
		}
	}
	delete(seen, s.Name)
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

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
	names := c.vips[k]
	if len(names) == 0 {
		return Conflict{}, false
	}
	losers := slices.Clone(names[1:])
	if slices.Contains(node.NodeIPs, k.addr) {
		for _, x := range c.nodePorts[portKey{k.proto, k.port}] {
			if !x.health && x.name != names[0] && !slices.Contains(losers, x.name) {
				losers = append(losers, x.name)
			}
		}
	}
	if len(losers) == 0 {
		return Conflict{}, false
	}
	return Conflict{Frontend: k.String(), Winner: names[0], Losers: losers}, true
}

// portConflict returns the clash at a node port, if several services
// claim it.
func (c *claims) portConflict(k portKey) (Conflict, bool) {
	cs := c.nodePorts[k]
	if len(cs) < 2 {
		return Conflict{}, false
	}
	what := fmt.Sprintf("node port %d/%s", k.port, k.proto)
	if cs[0].health {
		what = fmt.Sprintf("health check node port %d", k.port)
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
		v, n, _ := serviceClaims(svc)
		vips, nps = append(vips, v...), append(nps, n...)
		for _, k := range n {
			for _, a := range node.NodeIPs {
				vips = append(vips, frontKey{a, k.proto, k.port})
			}
		}
	}
	return vips, nps
}

// conflictSet holds the current clashes by frontend name.
type conflictSet map[string]Conflict

// update recomputes the clashes at the given frontends.
func (cs conflictSet) update(c *claims, node *NodeConfig, vips []frontKey, nps []portKey) {
	for _, k := range vips {
		if x, ok := c.vipConflict(node, k); ok {
			cs[x.Frontend] = x
		} else {
			delete(cs, k.String())
		}
	}
	for _, k := range nps {
		x, ok := c.portConflict(k)
		delete(cs, fmt.Sprintf("node port %d/%s", k.port, k.proto))
		delete(cs, fmt.Sprintf("health check node port %d", k.port))
		if ok {
			cs[x.Frontend] = x
		}
	}
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
