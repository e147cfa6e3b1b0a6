package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// portPlan is what one service port asks of the kernel: its virtual
// servers and the set entries of its helper rules. Every virtual address
// of the virtual servers sits on the dummy link.
type portPlan struct {
	key     servicelb.ServicePortKey
	servers []*VirtualServer
	entries []setEntry
}

// statePlan is what a whole State asks of the kernel.
type statePlan struct {
	ports   map[servicelb.ServicePortKey]*portPlan
	servers map[vsKey]*VirtualServer
	owner   map[vsKey]servicelb.ServicePortKey
	// nodeIPs are the node's addresses: never put on the dummy link.
	nodeIPs map[netip.Addr]bool
}

// planState plans every service port of st. It fails, with every mistake
// joined, when a port asks for something IPVS cannot do or two ports need
// the same virtual server.
func planState(st *servicelb.State) (*statePlan, error) {
	node := st.Node()
	p := &statePlan{
		ports:   map[servicelb.ServicePortKey]*portPlan{},
		servers: map[vsKey]*VirtualServer{},
		owner:   map[vsKey]servicelb.ServicePortKey{},
		nodeIPs: map[netip.Addr]bool{},
	}
	for _, a := range node.NodeIPs {
		p.nodeIPs[a] = true
	}
	var errs []error
	for _, sp := range st.Ports() {
		pp, err := planPort(&node, sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := p.add(sp, pp); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// add records a port's plan, refusing virtual servers another port owns.
func (p *statePlan) add(sp *servicelb.ServicePort, pp *portPlan) error {
	for _, vs := range pp.servers {
		if other, ok := p.owner[vs.key()]; ok {
			return conflict(sp, vs.key(), other)
		}
	}
	p.ports[pp.key] = pp
	for _, vs := range pp.servers {
		p.servers[vs.key()] = vs
		p.owner[vs.key()] = pp.key
	}
	return nil
}

// conflict reports a virtual server needed by sp and by another port.
func conflict(sp *servicelb.ServicePort, k vsKey, other servicelb.ServicePortKey) error {
	i := slices.IndexFunc(sp.Service.Ports, func(p servicelb.Port) bool { return p.Name == sp.Port.Name })
	return &servicelb.ValidationError{
		Service: sp.Key.Service, Field: fmt.Sprintf("ports[%d]", i), Value: k.String(),
		Err: fmt.Errorf("%w: also needed by %s", ErrConflict, other),
	}
}

// planPort plans one service port: a virtual server per cluster IP,
// external IP, load-balancer IP and node address, and its set entries.
func planPort(node *servicelb.NodeConfig, sp *servicelb.ServicePort) (*portPlan, error) {
	sched, err := schedulerName(sp)
	if err != nil {
		return nil, err
	}
	b := portBuilder{
		sp: sp, node: node, sched: sched, persist: persistence(sp.Affinity),
		pp: &portPlan{key: sp.Key}, hasBackends: sp.HasBackends(),
	}
	internal, external := realServers(sp.InternalBackends()), realServers(sp.ExternalBackends())
	if sp.ClusterIP.IsValid() {
		b.server(sp.ClusterIP, sp.Port.Port, internal)
		b.entry(setClusterIP, sp.ClusterIP, sp.Port.Port)
		b.vip(sp.ClusterIP)
	}
	for _, a := range sp.ExternalIPs {
		b.external(a, sp.Port.Port, external)
		b.vip(a)
	}
	for _, a := range sp.LoadBalancerIPs {
		b.external(a, sp.Port.Port, external)
		b.vip(a)
		b.sourceRanges(a)
	}
	for _, a := range sp.NodeIPs {
		b.external(a, sp.Port.NodePort, external)
	}
	for _, be := range sp.Backends() {
		b.pp.entries = append(b.pp.entries, setEntry{set: setLoopBack, family: sp.Family,
			addr: be.Addr, proto: sp.Port.Protocol, port: be.Port, addr2: be.Addr})
	}
	return b.pp, nil
}

// portBuilder accumulates a port's plan.
type portBuilder struct {
	sp          *servicelb.ServicePort
	node        *servicelb.NodeConfig
	sched       string
	persist     uint32
	hasBackends bool
	pp          *portPlan
}

func (b *portBuilder) server(a netip.Addr, port uint16, real []RealServer) {
	b.pp.servers = append(b.pp.servers, &VirtualServer{
		Addr: a, Protocol: b.sp.Port.Protocol, Port: port,
		Scheduler: b.sched, Persistence: b.persist, Real: slices.Clone(real),
	})
	if len(real) == 0 && b.hasBackends {
		// The other kind of traffic has backends: this one is dropped,
		// not rejected, since another node may serve it.
		b.entry(setDrop, a, port)
	}
}

// external adds a virtual server for traffic from outside the cluster,
// masqueraded unless the external policy is Local.
func (b *portBuilder) external(a netip.Addr, port uint16, real []RealServer) {
	b.server(a, port, real)
	if b.sp.ExternalLocal {
		b.entry(setExternalLocal, a, port)
	} else {
		b.entry(setExternal, a, port)
	}
}

func (b *portBuilder) entry(set string, a netip.Addr, port uint16) {
	b.pp.entries = append(b.pp.entries, setEntry{set: set, family: b.sp.Family, addr: a, proto: b.sp.Port.Protocol, port: port})
}

// vip lists a virtual address whose unserved ports are rejected, unless it
// is a node address: the node's own services must stay reachable.
func (b *portBuilder) vip(a netip.Addr) {
	if slices.Contains(b.node.NodeIPs, a) {
		return
	}
	b.pp.entries = append(b.pp.entries, setEntry{set: setVIP, family: b.sp.Family, addr: a})
}

// sourceRanges limits a load-balancer address to the service's source
// ranges and the node's own addresses. A service with source ranges only
// of the other family admits only the node here.
func (b *portBuilder) sourceRanges(a netip.Addr) {
	if len(b.sp.Service.SourceRanges) == 0 || slices.ContainsFunc(b.sp.SourceRanges, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return
	}
	b.entry(setLBFirewall, a, b.sp.Port.Port)
	allow := slices.Clone(b.sp.SourceRanges)
	for _, n := range b.node.IPs(b.sp.Family) {
		allow = append(allow, netip.PrefixFrom(n, n.BitLen()))
	}
	for _, p := range allow {
		b.pp.entries = append(b.pp.entries, setEntry{set: setLBSource, family: b.sp.Family,
			addr: a, proto: b.sp.Port.Protocol, port: b.sp.Port.Port, net: p})
	}
}

// ipvsSchedulers are the scheduler hints IPVS implements, by name.
func ipvsSchedulers() []servicelb.Scheduler {
	return []servicelb.Scheduler{
		servicelb.SchedulerRoundRobin, servicelb.SchedulerWeightedRR, servicelb.SchedulerLeastConn,
		servicelb.SchedulerWeightedLeastConn, servicelb.SchedulerSourceHash, servicelb.SchedulerDestinationHash,
		servicelb.SchedulerShortestDelay, servicelb.SchedulerNeverQueue, servicelb.SchedulerMaglev,
	}
}

// schedulerName returns the IPVS scheduler for a port's hint.
func schedulerName(sp *servicelb.ServicePort) (string, error) {
	s := sp.Scheduler
	if s == servicelb.SchedulerDefault {
		return DefaultScheduler, nil
	}
	if slices.Contains(ipvsSchedulers(), s) {
		return string(s), nil
	}
	return "", unsupported(sp.Key.Service, "scheduler", fmt.Sprintf("%q", s),
		fmt.Sprintf("IPVS schedulers are %v", ipvsSchedulers()))
}

// persistence returns an affinity timeout in whole seconds, rounded up.
func persistence(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32((d + time.Second - 1) / time.Second)
}

func realServers(bs []servicelb.Backend) []RealServer {
	out := make([]RealServer, 0, len(bs))
	for _, b := range bs {
		out = append(out, RealServer{Addr: b.Addr, Port: b.Port, Weight: b.Weight})
	}
	slices.SortFunc(out, compareReal)
	return out
}

// addresses returns the addresses the plan puts on the dummy link: those
// of its virtual servers that are not node addresses, sorted.
func (p *statePlan) addresses() []netip.Addr {
	set := map[netip.Addr]bool{}
	for k := range p.servers {
		if !p.nodeIPs[k.addr] {
			set[k.addr] = true
		}
	}
	return slices.SortedFunc(maps.Keys(set), netip.Addr.Compare)
}

// entries returns every set entry of the plan, deduplicated.
func (p *statePlan) entries() map[setEntry]int {
	out := map[setEntry]int{}
	for _, pp := range p.ports {
		for _, e := range pp.entries {
			out[e]++
		}
	}
	return out
}
