//go:build linux

package ebpf

import (
	"fmt"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// A role says which endpoint set of a service port a set holds.
type role uint8

const (
	roleCluster role = iota
	roleLocal
)

func (r role) String() string { return [...]string{"cluster", "local"}[r] }

// socketAction is what the hooks do with a new flow from origin o to a
// frontend of kind k: servicelb's verdict where a socket can give it
// exactly, else actPass, which leaves the flow to the packet path:
//
//   - reject and drop pass when a packet path serves beside the hooks
//     (paired), which gives them as kube-proxy's rules do: an ICMP error
//     for a reject, silence for a drop (a pod's connect times out). The
//     hooks alone give them at the socket (ECONNREFUSED, EPERM), the
//     only way they have, and declare no servicelb.FeaturePacketVerdicts;
//   - a forward without masquerade from a pod, and one with masquerade
//     from the node, are given by connecting the socket to the endpoint
//     itself: the pod's own address, or the node's address on the way to
//     the endpoint, is the source masquerade would give;
//   - a forward with masquerade from a pod, a forward without masquerade
//     from the node (whose source address would differ), and every flow
//     to a load-balancer IP with source ranges pass.
func socketAction(sp *servicelb.ServicePort, k servicelb.FrontendKind, o servicelb.Origin, paired bool) (action, role) {
	if k == servicelb.LoadBalancerFrontend && len(sp.SourceRanges) > 0 {
		return actPass, 0
	}
	v := sp.Verdicts(k).Of(o)
	switch {
	case (v.Action == servicelb.Reject || v.Action == servicelb.Drop) && paired:
		return actPass, 0
	case v.Action == servicelb.Reject:
		return actReject, 0
	case v.Action == servicelb.Drop:
		return actDrop, 0
	}
	if (o == servicelb.FromPod) == v.Masquerade {
		return actPass, 0
	}
	if v.Action == servicelb.ToLocal {
		return actForward, roleLocal
	}
	return actForward, roleCluster
}

// podAction is socketAction for a socket in a pod's namespace. When the
// node does not tell pods by their namespace (servicelb's
// NodeConfig.PodsByNamespace), the packet path may see such a flow as a
// pod's or as one from outside; the socket gives the verdict only when
// the two agree, and passes the flow otherwise.
func podAction(sp *servicelb.ServicePort, k servicelb.FrontendKind, byNamespace, paired bool) (action, role) {
	if !byNamespace {
		vs := sp.Verdicts(k)
		if vs.Of(servicelb.FromPod) != vs.Of(servicelb.FromOutside) {
			return actPass, 0
		}
	}
	return socketAction(sp, k, servicelb.FromPod, paired)
}

// carried reports whether the hooks carry a protocol: TCP and UDP. SCTP
// flows are left to the packet path.
func carried(p servicelb.Protocol) bool { return p == servicelb.TCP || p == servicelb.UDP }

// frontendPlan is one frontend's entry, its sets named by role.
type frontendPlan struct {
	key              feKey
	kind             servicelb.FrontendKind
	nodeAct, podAct  action
	nodeRole, podRol role
}

// planFrontends returns the entries of a service port's frontends, and
// which of its sets they use; byNamespace is the node's
// PodsByNamespace; paired, that a packet path serves beside the hooks.
func planFrontends(sp *servicelb.ServicePort, byNamespace, paired bool) ([]frontendPlan, [2]bool) {
	var used [2]bool
	if !carried(sp.Port.Protocol) {
		return nil, used
	}
	var out []frontendPlan
	for _, f := range sp.Frontends() {
		na, nr := socketAction(sp, f.Kind, servicelb.FromNode, paired)
		pa, pr := podAction(sp, f.Kind, byNamespace, paired)
		if na == actPass && pa == actPass {
			continue
		}
		if na == actForward {
			used[nr] = true
		}
		if pa == actForward {
			used[pr] = true
		}
		out = append(out, frontendPlan{key: newFEKey(f.Addr, f.Port, sp.Port.Protocol), kind: f.Kind,
			nodeAct: na, podAct: pa, nodeRole: nr, podRol: pr})
	}
	return out, used
}

// slotCounts returns how many slots each backend takes: its weight over
// the weights' greatest common divisor, scaled down (each keeping one at
// least) when they add up to more than maxSlots.
func slotCounts(bs []servicelb.Backend) []int {
	g, sum := 0, 0
	for _, b := range bs {
		g = gcd(g, int(b.Weight))
		sum += int(b.Weight)
	}
	out := make([]int, len(bs))
	for i, b := range bs {
		n := int(b.Weight) / max(g, 1)
		if sum/max(g, 1) > maxSlots {
			n = max(1, int(b.Weight)*maxSlots/sum)
		}
		out[i] = n
	}
	return out
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// relayout places the wanted endpoints (each as many times as want says,
// in the order given) in slots, moving as few as it can from old: an
// endpoint keeps the slots it has, new ones fill the slots of endpoints
// that went, then the slots after the last; when the set shrinks, the
// endpoints in the slots past its new end move into the gaps. It uses
// want up.
func relayout(old []endpoint, order []endpoint, want map[endpoint]int) []endpoint {
	keep := want
	total := 0
	for _, n := range want {
		total += n
	}
	next := make([]endpoint, max(len(old), total))
	held := make([]bool, len(next))
	for i, e := range old {
		if keep[e] > 0 {
			next[i], held[i] = e, true
			keep[e]--
		}
	}
	var items []endpoint
	for _, e := range order {
		for ; keep[e] > 0; keep[e]-- {
			items = append(items, e)
		}
	}
	for i := total; i < len(old); i++ {
		if held[i] {
			items = append(items, next[i])
		}
	}
	for i := 0; i < total && len(items) > 0; i++ {
		if !held[i] {
			next[i], held[i] = items[0], true
			items = items[1:]
		}
	}
	return next[:total]
}

// setPlan is the content of one set.
type setPlan struct {
	id      uint32
	name    string
	slots   []endpoint
	timeout uint32
	members bool // affinity, or UDP: the endpoints are listed in kp_members
}

// portPlan is what one service port holds in the maps.
type portPlan struct {
	// frontends lists the port's frontends, each once: a port has few,
	// and a slice of them takes a tenth of the memory of a map.
	frontends []frontendEntry
	sets      [2]*setPlan
}

// frontendEntry is a frontend of a port: its key and value in
// kp_frontends, and its kind, for Render.
type frontendEntry struct {
	key  feKey
	val  feVal
	kind servicelb.FrontendKind
}

// ids hands out set ids: the lowest free one from 1.
type ids struct {
	used map[uint32]bool
	next uint32
	// taken records the ids handed out since track, for untake.
	taken []uint32
}

func newIDs() *ids { return &ids{used: map[uint32]bool{}, next: 1} }

func (a *ids) take() (uint32, error) {
	for n := 0; a.used[a.next] || a.next == 0; n++ {
		if n > len(a.used)+1 {
			return 0, fmt.Errorf("no set id left")
		}
		a.next++
	}
	id := a.next
	a.used[id] = true
	a.next++
	a.taken = append(a.taken, id)
	return id, nil
}

func (a *ids) free(id uint32) {
	delete(a.used, id)
	if id < a.next {
		a.next = id
	}
}

// track starts recording the ids taken; untake frees them again.
func (a *ids) track() { a.taken = a.taken[:0] }

func (a *ids) untake() {
	for _, id := range a.taken {
		a.free(id)
	}
	a.taken = a.taken[:0]
}

func setName(k servicelb.ServicePortKey, r role) string { return k.String() + " " + r.String() }

// planPort returns what sp holds in the maps. Its sets keep the ids and
// slot layouts of old (the port's plan before a change, or what a
// restarted process found in the kernel); new sets take ids from a.
func planPort(sp *servicelb.ServicePort, byNamespace, paired bool, old *portPlan, a *ids) (*portPlan, error) {
	fes, used := planFrontends(sp, byNamespace, paired)
	pp := &portPlan{frontends: make([]frontendEntry, 0, len(fes))}
	for r, bs := range [2][]servicelb.Backend{sp.Cluster, sp.Local} {
		if !used[r] {
			continue
		}
		var prev *setPlan
		if old != nil {
			prev = old.sets[r]
		}
		s, err := planSet(sp, role(r), bs, prev, a)
		if err != nil {
			return nil, err
		}
		pp.sets[r] = s
	}
	for _, f := range fes {
		v := feVal{NodeAct: f.nodeAct, PodAct: f.podAct}
		if f.nodeAct == actForward {
			v.NodeSet = pp.sets[f.nodeRole].id
		}
		if f.podAct == actForward {
			v.PodSet = pp.sets[f.podRol].id
		}
		e := frontendEntry{key: f.key, val: v, kind: f.kind}
		if i := pp.index(f.key); i >= 0 {
			pp.frontends[i] = e // servicelb lists each frontend once: a guard
		} else {
			pp.frontends = append(pp.frontends, e)
		}
	}
	return pp, nil
}

func planSet(sp *servicelb.ServicePort, r role, bs []servicelb.Backend, prev *setPlan, a *ids) (*setPlan, error) {
	s := &setPlan{name: setName(sp.Key, r), timeout: uint32(sp.Affinity.Seconds()), members: sp.Affinity > 0 || sp.Port.Protocol == servicelb.UDP}
	if prev != nil {
		s.id = prev.id
	} else {
		id, err := a.take()
		if err != nil {
			return nil, err
		}
		s.id = id
	}
	counts := slotCounts(bs)
	order := make([]endpoint, len(bs))
	want := make(map[endpoint]int, len(bs))
	for i, b := range bs {
		order[i] = newEndpoint(b.Addr, b.Port)
		want[order[i]] += counts[i]
	}
	var oldSlots []endpoint
	if prev != nil {
		oldSlots = prev.slots
	}
	s.slots = relayout(oldSlots, order, want)
	return s, nil
}

// frontend returns a frontend's entry in the plan (a nil plan has none).
func (pp *portPlan) frontend(k feKey) (feVal, bool) {
	if i := pp.index(k); i >= 0 {
		return pp.frontends[i].val, true
	}
	return feVal{}, false
}

// index returns where the plan lists a frontend, or -1.
func (pp *portPlan) index(k feKey) int {
	if pp == nil {
		return -1
	}
	for i, f := range pp.frontends {
		if f.key == k {
			return i
		}
	}
	return -1
}

// setIDs returns the ids of a plan's sets.
func (pp *portPlan) setIDs() []uint32 {
	var out []uint32
	for _, s := range pp.sets {
		if s != nil {
			out = append(out, s.id)
		}
	}
	return out
}

// goneSets returns the ids of old's sets that next no longer has.
func goneSets(old, next *portPlan) []uint32 {
	if old == nil {
		return nil
	}
	var keep []uint32
	if next != nil {
		keep = next.setIDs()
	}
	var out []uint32
	for _, id := range old.setIDs() {
		if !slices.Contains(keep, id) {
			out = append(out, id)
		}
	}
	return out
}

// value is the set's entry in kp_sets.
func (s *setPlan) value() setVal { return setVal{Count: uint32(len(s.slots)), Timeout: s.timeout} }

// memberSet returns the endpoints kp_members lists for the set: none
// unless it keeps affinity (nil set: none).
func (s *setPlan) memberSet() map[endpoint]bool {
	if s == nil || !s.members {
		return nil
	}
	m := make(map[endpoint]bool, len(s.slots))
	for _, e := range s.slots {
		m[e] = true
	}
	return m
}
