//go:build linux

package ebpf

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// model is what the Proxier wrote: the plan of each service port, and the
// set ids in use; byNamespace is the node's PodsByNamespace the plans
// were made with; paired says that a packet path serves beside the hooks
// (Options.Packets), which then leave it the verdicts that refuse.
type model struct {
	ports       map[servicelb.ServicePortKey]*portPlan
	ids         *ids
	byNamespace bool
	paired      bool
}

// buildModel plans every port of st, checked against caps. Sets keep the
// ids and slot layouts found (by name) in found, the maps' content, when
// given: what a restarted Proxier adopts.
func buildModel(st *servicelb.State, caps *servicelb.Capabilities, found *content, paired bool) (*model, error) {
	node := st.Node()
	m := &model{ports: map[servicelb.ServicePortKey]*portPlan{}, ids: newIDs(), byNamespace: node.PodsByNamespace(), paired: paired}
	prev := adopted(found)
	for _, id := range prev.ids {
		m.ids.used[id] = true
	}
	var errs []error
	for _, sp := range st.Ports() {
		if err := caps.CheckPort(sp); err != nil {
			errs = append(errs, err)
			continue
		}
		pp, err := planPort(sp, m.byNamespace, m.paired, prev.port(sp.Key), m.ids)
		if err != nil {
			return nil, err
		}
		m.ports[sp.Key] = pp
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// Ids found but not planned again are free.
	for _, id := range prev.ids {
		if !m.usesSet(id) {
			m.ids.free(id)
		}
	}
	return m, m.checkFrontends()
}

func (m *model) usesSet(id uint32) bool {
	for _, pp := range m.ports {
		if slices.Contains(pp.setIDs(), id) {
			return true
		}
	}
	return false
}

// checkFrontends reports a frontend two ports hold (servicelb gives each
// to one service: this is a guard).
func (m *model) checkFrontends() error {
	seen := map[feKey]servicelb.ServicePortKey{}
	for k, pp := range m.ports {
		for _, fe := range pp.frontends {
			if o, ok := seen[fe.key]; ok {
				return fmt.Errorf("frontend %s held by both %s and %s", fe.key, o, k)
			}
			seen[fe.key] = k
		}
	}
	return nil
}

// content returns what the maps hold under the model.
func (m *model) content(cookie uint64) *content {
	c := newContent()
	for _, pp := range m.ports {
		c.add(pp)
	}
	c.cfg = cfgVal{NodeCookie: cookie}
	return c
}

// annotations name each frontend's service port and kind, for Dump.
func (m *model) annotations() map[feKey]string {
	out := map[feKey]string{}
	for k, pp := range m.ports {
		for _, fe := range pp.frontends {
			out[fe.key] = fmt.Sprintf("%s %s", k, fe.kind)
		}
	}
	return out
}

// adoption is what a restarted Proxier finds of its sets in the maps: the
// plan of each set, by service port, as far as the maps tell it.
type adoption struct {
	sets map[servicelb.ServicePortKey]*portPlan
	ids  []uint32
}

func (a adoption) port(k servicelb.ServicePortKey) *portPlan { return a.sets[k] }

// adopted reads the names and slots of the sets in c.
func adopted(c *content) adoption {
	a := adoption{sets: map[servicelb.ServicePortKey]*portPlan{}}
	if c == nil {
		return a
	}
	for id, n := range c.names {
		key, r, ok := parseSetName(n.String())
		if !ok {
			continue
		}
		pp := a.sets[key]
		if pp == nil {
			pp = &portPlan{}
			a.sets[key] = pp
		}
		if pp.sets[r] != nil {
			continue // the same name twice: keep one, the other is rewritten
		}
		s := &setPlan{id: id, name: n.String()}
		count := c.sets[id].Count
		for i := range count {
			e, ok := c.slots[slotKey{id, i}]
			if !ok {
				break
			}
			s.slots = append(s.slots, e)
		}
		pp.sets[r] = s
		a.ids = append(a.ids, id)
	}
	slices.Sort(a.ids)
	return a
}

// parseSetName parses "<service>:<port>/<family> <role>".
func parseSetName(s string) (servicelb.ServicePortKey, role, bool) {
	rest, r, ok := strings.Cut(s, " ")
	if !ok {
		return servicelb.ServicePortKey{}, 0, false
	}
	var ro role
	switch r {
	case "cluster":
		ro = roleCluster
	case "local":
		ro = roleLocal
	default:
		return servicelb.ServicePortKey{}, 0, false
	}
	i := strings.LastIndexByte(rest, '/')
	j := strings.LastIndexByte(rest, ':')
	if i < 0 || j < 0 || j > i {
		return servicelb.ServicePortKey{}, 0, false
	}
	var f servicelb.Family
	switch rest[i+1:] {
	case "ipv4":
		f = servicelb.IPv4
	case "ipv6":
		f = servicelb.IPv6
	default:
		return servicelb.ServicePortKey{}, 0, false
	}
	return servicelb.ServicePortKey{Service: rest[:j], Port: rest[j+1 : i], Family: f}, ro, true
}

// step is a planned change of the model: the writes, the new plans of
// the ports it touches (nil: removed) and the set ids it frees, which no
// set of the same step takes, so that no id is deleted and written in
// one step. The ids it takes are taken from the model's already: commit
// or abandon the step before planning another.
type step struct {
	d           *delta
	ports       map[servicelb.ServicePortKey]*portPlan
	freed       []uint32
	byNamespace bool
}

// plan plans the changes ch that lead to st over m: the ports ch names,
// or every port when the node's PodsByNamespace changed, which every
// port's pod entries follow. Only the ids it takes change m; abandon
// gives them back.
func (m *model) plan(st *servicelb.State, ch *servicelb.Changes, caps *servicelb.Capabilities) (*step, error) {
	node := st.Node()
	s := &step{d: &delta{}, ports: map[servicelb.ServicePortKey]*portPlan{}, byNamespace: node.PodsByNamespace()}
	m.ids.track()
	var errs []error
	var given map[feKey]feVal // frontends ports give up, and what they held
	change := func(old *portPlan, sp *servicelb.ServicePort, key servicelb.ServicePortKey) {
		var next *portPlan
		if sp != nil {
			if err := caps.CheckPort(sp); err != nil {
				errs = append(errs, err)
				return
			}
			var err error
			if next, err = planPort(sp, s.byNamespace, m.paired, old, m.ids); err != nil {
				errs = append(errs, err)
				return
			}
		}
		s.freed = append(s.freed, goneSets(old, next)...)
		gone := len(s.d.fe.del)
		diffPlans(s.d, old, next)
		for _, k := range s.d.fe.del[gone:] {
			if given == nil {
				given = map[feKey]feVal{}
			}
			given[k], _ = old.frontend(k)
		}
		s.ports[key] = next
	}
	for _, sp := range ch.Removed {
		change(m.ports[sp.Key], nil, sp.Key)
	}
	if s.byNamespace != m.byNamespace {
		for _, sp := range st.Ports() {
			change(m.ports[sp.Key], sp, sp.Key)
		}
	} else {
		for _, c := range ch.Changed {
			change(m.ports[c.Old.Key], c.New, c.New.Key)
		}
		for _, sp := range ch.Added {
			change(m.ports[sp.Key], sp, sp.Key)
		}
	}
	if err := errors.Join(errs...); err != nil {
		m.abandon()
		return nil, err
	}
	// A frontend one port gives up and another takes is written, not
	// deleted; not even written when it stays as it was.
	s.d.fe.del = slices.DeleteFunc(s.d.fe.del, func(k feKey) bool {
		v, ok := s.d.fe.put[k]
		if ok && v == given[k] {
			delete(s.d.fe.put, k)
		}
		return ok
	})
	return s, nil
}

// abandon gives back the ids the last plan took.
func (m *model) abandon() { m.ids.untake() }

// commit makes the step's plans the model's.
func (m *model) commit(s *step) {
	for k, pp := range s.ports {
		if pp == nil {
			delete(m.ports, k)
		} else {
			m.ports[k] = pp
		}
	}
	for _, id := range s.freed {
		m.ids.free(id)
	}
	m.byNamespace = s.byNamespace
	m.ids.track()
}

// content is what the maps hold (or should): one Go map per BPF map. The
// LRU maps (pins and reverse translations) are the hooks' own and are
// not part of it.
type content struct {
	fe      map[feKey]feVal
	sets    map[uint32]setVal
	slots   map[slotKey]endpoint
	members map[memberKey]uint32
	names   map[uint32]nameVal
	cfg     cfgVal
}

// hookContent is what the hooks write themselves: the ClientIP
// affinity pins (kp_affinity), the reverse translations of sockets
// (kp_revnat) and the endpoints of unconnected UDP sockets' flows
// (kp_udpflows). The Proxier never writes them; Dump lists them.
type hookContent struct {
	affinity map[affKey]affVal
	reverse  map[revKey]endpoint
	flows    map[affKey]affVal
	// now is the time (CLOCK_MONOTONIC, ns, as the hooks stamp pins)
	// they were read at.
	now uint64
	// sizes bound the maps: an LRU map full drops its least recently
	// used entry for a new one.
	sizes Sizes
}

func newContent() *content {
	return &content{fe: map[feKey]feVal{}, sets: map[uint32]setVal{}, slots: map[slotKey]endpoint{},
		members: map[memberKey]uint32{}, names: map[uint32]nameVal{}}
}

// add adds a port's entries.
func (c *content) add(pp *portPlan) {
	for _, f := range pp.frontends {
		c.fe[f.key] = f.val
	}
	for _, s := range pp.sets {
		if s != nil {
			c.addSet(s)
		}
	}
}

func (c *content) addSet(s *setPlan) {
	c.sets[s.id] = s.value()
	c.names[s.id] = newName(s.name)
	for i, e := range s.slots {
		c.slots[slotKey{s.id, uint32(i)}] = e
		if s.members {
			c.members[memberKey{Set: s.id, endpoint: e}] = 1
		}
	}
}
