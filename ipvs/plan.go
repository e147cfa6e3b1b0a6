//go:build linux

package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/internal/xtables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// planEnv is what planning a port needs besides the port: the node's
// addresses (never put on the dummy link), its masquerade mark, the marks
// the proxier may give and the backend's capabilities.
type planEnv struct {
	nodeIPs map[netip.Addr]bool
	masq    uint32
	space   markSpace
	caps    servicelb.Capabilities
}

func newPlanEnv(node *servicelb.NodeConfig, o *Options) (planEnv, error) {
	env := planEnv{nodeIPs: map[netip.Addr]bool{}, masq: node.MasqueradeMark(),
		space: markSpace{o.FWMarkMask}, caps: capabilities(o)}
	if err := env.caps.CheckNode(node); err != nil {
		return env, err
	}
	if env.masq&o.FWMarkMask != 0 {
		return env, fmt.Errorf("%w: FWMarkMask %#x holds the node's masquerade mark %#x", ErrInvalidOptions, o.FWMarkMask, env.masq)
	}
	for _, a := range node.NodeIPs {
		env.nodeIPs[a] = true
	}
	return env, nil
}

// portPlan is what one service port asks of the kernel: an address
// virtual server per frontend, set entries, and for the origins whose
// verdict differs from the outside verdict of a frontend, steers: the
// mark rules and firewall-mark virtual servers that take their flows
// elsewhere.
type portPlan struct {
	sp      *servicelb.ServicePort
	servers []*VirtualServer
	entries []setEntry
	steers  []steer
	// units are the marks the steers need, sorted.
	units []markUnit
	// fwServers and rules are the steers made real with the marks (see
	// realize): the firewall-mark virtual servers, and the rules of the
	// FROM-POD and FROM-NODE chains.
	fwServers []*VirtualServer
	rules     [2][]xtables.Rule
}

// steer is the flows of one origin to one frontend that take another
// verdict than the frontend's virtual server gives.
type steer struct {
	origin servicelb.Origin
	front  servicelb.Frontend
	v      servicelb.Verdict
}

// unit returns the mark a steer needs; a drop needs none.
func (s steer) unit(k servicelb.ServicePortKey) (markUnit, bool) {
	return markUnit{k, s.v.Action}, s.v.Action != servicelb.Drop
}

func (pp *portPlan) key() servicelb.ServicePortKey { return pp.sp.Key }

// allServers returns the port's address and firewall-mark virtual servers.
func (pp *portPlan) allServers() []*VirtualServer { return slices.Concat(pp.servers, pp.fwServers) }

// planPort plans one service port from its verdicts. The marks of its
// steers are added by realize.
func planPort(env *planEnv, sp *servicelb.ServicePort) (*portPlan, error) {
	if err := env.caps.CheckPort(sp); err != nil {
		return nil, err
	}
	b := portBuilder{env: env, sp: sp, pp: &portPlan{sp: sp}, proto: sp.Port.Protocol}
	for _, f := range sp.Frontends() {
		b.frontend(f)
	}
	for _, be := range sp.Backends() {
		b.pp.entries = append(b.pp.entries, setEntry{set: setLoopBack, family: sp.Family,
			addr: be.Addr, proto: b.proto, port: be.Port, addr2: be.Addr})
	}
	for _, s := range b.pp.steers {
		if u, ok := s.unit(sp.Key); ok && !slices.Contains(b.pp.units, u) {
			b.pp.units = append(b.pp.units, u)
		}
	}
	slices.SortFunc(b.pp.units, compareUnits)
	return b.pp, nil
}

// portBuilder accumulates a port's plan.
type portBuilder struct {
	env   *planEnv
	sp    *servicelb.ServicePort
	proto servicelb.Protocol
	pp    *portPlan
}

// frontend plans one frontend: its virtual server serves the outside
// verdict, the fall-through of every origin whose flows no mark steers.
func (b *portBuilder) frontend(f servicelb.Frontend) {
	vs := b.sp.Verdicts(f.Kind)
	out := vs.Of(servicelb.FromOutside)
	b.pp.servers = append(b.pp.servers, newServer(b.sp, func(vs *VirtualServer) {
		vs.Addr, vs.Protocol, vs.Port = f.Addr, b.proto, f.Port
	}, b.sp.Targets(out)))
	b.entry(setFrontends, f)
	b.masquerade(f, vs)
	if out.Action == servicelb.Drop {
		b.entry(setDrop, f)
	}
	if f.Kind == servicelb.LoadBalancerFrontend {
		b.sourceRanges(f, vs)
	}
	if f.Kind != servicelb.NodePortFrontend && !b.env.nodeIPs[f.Addr] {
		b.pp.entries = append(b.pp.entries, setEntry{set: setVIP, family: b.sp.Family, addr: f.Addr})
	}
	for _, o := range []servicelb.Origin{servicelb.FromPod, servicelb.FromNode} {
		if v := vs.Of(o); v.Action != out.Action {
			b.pp.steers = append(b.pp.steers, steer{origin: o, front: f, v: v})
		}
	}
}

// masquerade lists a frontend in the masquerade sets of the origins whose
// verdicts masquerade.
func (b *portBuilder) masquerade(f servicelb.Frontend, vs servicelb.Verdicts) {
	o, p, n := vs.Of(servicelb.FromOutside).Masquerade, vs.Of(servicelb.FromPod).Masquerade, vs.Of(servicelb.FromNode).Masquerade
	if o && p && n {
		b.entry(setMasq, f)
		return
	}
	for _, m := range []struct {
		on  bool
		set string
	}{{o, setMasqOutside}, {p, setMasqPod}, {n, setMasqNode}} {
		if m.on {
			b.entry(m.set, f)
		}
	}
}

// sourceRanges limits a load-balancer frontend to the port's source
// ranges, when a verdict forwards its flows (a frontend that rejects or
// drops every flow does so whatever the source).
func (b *portBuilder) sourceRanges(f servicelb.Frontend, vs servicelb.Verdicts) {
	if len(b.sp.SourceRanges) == 0 || !slices.ContainsFunc(vs[:], func(v servicelb.Verdict) bool { return v.Action.Forwards() }) {
		return
	}
	b.entry(setLBFirewall, f)
	for _, p := range b.sp.SourceRanges {
		b.pp.entries = append(b.pp.entries, setEntry{set: setLBSource, family: b.sp.Family,
			addr: f.Addr, proto: b.proto, port: f.Port, net: p})
	}
}

func (b *portBuilder) entry(set string, f servicelb.Frontend) {
	b.pp.entries = append(b.pp.entries, setEntry{set: set, family: b.sp.Family, addr: f.Addr, proto: b.proto, port: f.Port})
}

// newServer returns a virtual server with the port's scheduling and the
// given real servers, named by name.
func newServer(sp *servicelb.ServicePort, name func(*VirtualServer), targets []servicelb.Backend) *VirtualServer {
	sched := string(sp.Scheduler)
	if sp.Scheduler == servicelb.SchedulerDefault {
		sched = DefaultScheduler
	}
	vs := &VirtualServer{Scheduler: sched, HashPort: sp.Scheduler == servicelb.SchedulerMaglev,
		Persistence: uint32(sp.Affinity / time.Second), Real: realServers(targets), serving: sp.ServingEndpoints()}
	name(vs)
	return vs
}

// realize makes a port's steers real with the marks: a firewall-mark
// virtual server per mark and masquerade (IPVS looks them up by the whole
// packet mark, so the masquerade bit the node's flows carry makes another
// one), and a rule per steer in the chain of its origin, marking its
// flows or dropping them.
func (pp *portPlan) realize(env *planEnv, marks map[markUnit]uint32) {
	pp.fwServers, pp.rules = nil, [2][]xtables.Rule{}
	byMark := map[uint32]*VirtualServer{}
	for _, s := range pp.steers {
		var target xtables.Target = xtables.Drop
		if u, ok := s.unit(pp.sp.Key); ok {
			m := marks[u]
			if s.v.Masquerade {
				m |= env.masq
			}
			if byMark[m] == nil {
				byMark[m] = newServer(pp.sp, func(vs *VirtualServer) {
					vs.FWMark, vs.Family, vs.Protocol = m, pp.sp.Family, pp.sp.Port.Protocol
				}, pp.sp.Targets(s.v))
				pp.fwServers = append(pp.fwServers, byMark[m])
			}
			target = xtables.SetMark{Value: m, Mask: 0xffffffff}
		}
		i := originChain(s.origin)
		pp.rules[i] = append(pp.rules[i], steerRule(pp.sp, s.front, target))
	}
}

// steerRule matches the flows to a frontend.
func steerRule(sp *servicelb.ServicePort, f servicelb.Frontend, t xtables.Target) xtables.Rule {
	proto := sp.Port.Protocol.Number()
	return xtables.Rule{Dst: netip.PrefixFrom(f.Addr, f.Addr.BitLen()), Proto: proto,
		Matches: []xtables.Match{xtables.Comment(sp.Key.String()), xtables.Port{Proto: proto, DPort: f.Port}}, Target: t}
}

// ipvsSchedulers are the scheduler hints IPVS implements, by name.
func ipvsSchedulers() []servicelb.Scheduler {
	return []servicelb.Scheduler{
		servicelb.SchedulerRoundRobin, servicelb.SchedulerWeightedRR, servicelb.SchedulerLeastConn,
		servicelb.SchedulerWeightedLeastConn, servicelb.SchedulerSourceHash, servicelb.SchedulerDestinationHash,
		servicelb.SchedulerShortestDelay, servicelb.SchedulerNeverQueue, servicelb.SchedulerMaglev,
	}
}

// capabilities are what the proxier expresses: every feature but
// localhost node ports, affinity expiry and lingering flows, the IPVS
// schedulers, every protocol, any number of endpoints.
// capabilities are the Capabilities of a Proxier with options o.
func capabilities(o *Options) servicelb.Capabilities {
	// IPVS keeps a persistence template while connections it scheduled
	// are in its table, TIME_WAIT included: a pin can outlive its timeout.
	// A connection whose real server or virtual server is gone ends at
	// its next packet (expire_nodest_conn, as kube-proxy's IPVS mode sets
	// it), where conntrack would keep a flow whose service no endpoint
	// serves any more.
	lacks := servicelb.FeatureAffinityExpiry | servicelb.FeatureLocalhostNodePorts | servicelb.FeatureLingeringFlows
	if !o.StrictARP {
		// The dummy link's addresses are the node's: it answers ARP
		// for them on every link.
		lacks |= servicelb.FeatureNoARPAnswers
	}
	return servicelb.Capabilities{Backend: "ipvs", Schedulers: ipvsSchedulers(),
		Features: servicelb.AllFeatures &^ lacks}
}

func realServers(bs []servicelb.Backend) []RealServer {
	out := make([]RealServer, 0, len(bs))
	for _, b := range bs {
		out = append(out, RealServer{Addr: b.Addr, Port: b.Port, Weight: b.Weight})
	}
	slices.SortFunc(out, compareReal)
	return out
}

// originChain returns the index of the chain of an origin's steers.
func originChain(o servicelb.Origin) int {
	if o == servicelb.FromPod {
		return 0
	}
	return 1
}
