//go:build linux

package userspace

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// node is what the data path needs of the NodeConfig: how to tell the
// origin of a flow. It is replaced whole when the node changes.
type node struct {
	// pods are the sources of the node's pods' flows: the prefixes of
	// its local-traffic detection (the cluster CIDRs, or the node's pod
	// CIDRs), in both families.
	pods  []netip.Prefix
	addrs map[netip.Addr]bool
	// iface is the interface (ifacePrefix: the start of the name of the
	// interfaces) the node's pods' flows come in on, when it tells them
	// so.
	iface       string
	ifacePrefix bool
}

func newNode(n servicelb.NodeConfig) *node {
	pods := slices.Concat(n.LocalMatch(servicelb.IPv4).CIDRs, n.LocalMatch(servicelb.IPv6).CIDRs)
	m := n.LocalMatch(servicelb.IPv4) // an interface serves both families
	nd := &node{pods: pods, addrs: map[netip.Addr]bool{}, iface: m.Interface, ifacePrefix: m.Prefix}
	for _, a := range n.NodeIPs {
		nd.addrs[a] = true
	}
	for _, a := range n.LocalIPs {
		nd.addrs[a] = true
	}
	return nd
}

// origin tells where a flow from src to the proxy's address local comes
// from, as servicelb defines origins: a pod when src lies in the
// prefixes of the node's local-traffic detection (NodeConfig.LocalMatch:
// the cluster CIDRs, or the node's pod CIDRs) or when it came in on the
// pods' interface (in names it, called only for a node that tells pods
// so; nil when unknown); else the node when src is an address of the
// node (the flow's own destination, a loopback address, or one of the
// node's addresses in NodeIPs and LocalIPs); else outside.
func (nd *node) origin(src, local netip.Addr, in func() string) servicelb.Origin {
	if nd.iface != "" && in != nil && nd.isPodIface(in()) {
		return servicelb.FromPod
	}
	for _, p := range nd.pods {
		if p.Contains(src) {
			return servicelb.FromPod
		}
	}
	if src == local || src.IsLoopback() || nd.addrs[src] {
		return servicelb.FromNode
	}
	return servicelb.FromOutside
}

// portState is one service port the proxy serves: the decision it
// follows now, the state that outlives changes of it (affinity pins,
// open connections, counters), and the listeners of its frontends.
type portState struct {
	key   servicelb.ServicePortKey
	proto servicelb.Protocol
	stats portStats
	// flows counts the port's connections and sessions (see budget).
	flows atomic.Int64
	tab   atomic.Pointer[table]

	// conns are the open TCP and SCTP connections, for draining.
	mu    sync.Mutex
	conns map[*conn]struct{}
	// gone is set once the port is no longer served: its connections
	// drain.
	gone atomic.Bool

	// Owned by the sync (the Proxier's lock): the decision, the
	// listeners, and the addresses held for the port.
	sp   *servicelb.ServicePort
	lns  map[listenKey]*listener
	held []netip.Addr
}

// table is what a listener does with a new flow: the port's decision with
// its endpoint sets ready to pick from. It never changes; a change of the
// port stores a new one.
type table struct {
	sp   *servicelb.ServicePort
	sets [2]*targets // cluster, local
	// pins are the affinity pins of the sets, carried from one table of
	// the port to the next while it has affinity.
	pins [2]*pins
}

// Set indexes.
const (
	clusterSet = 0
	localSet   = 1
)

func newPortState(sp *servicelb.ServicePort) *portState {
	return &portState{key: sp.Key, proto: sp.Port.Protocol, conns: map[*conn]struct{}{}, lns: map[listenKey]*listener{}}
}

// update makes ps follow sp: a new table, with the pins of the old one
// while sp has affinity.
func (ps *portState) update(sp *servicelb.ServicePort) {
	t := &table{sp: sp}
	if len(sp.Cluster) > 0 {
		t.sets[clusterSet] = newTargets(sp.Cluster, sp.Scheduler)
	}
	if len(sp.Local) > 0 {
		t.sets[localSet] = newTargets(sp.Local, sp.Scheduler)
	}
	if sp.Affinity > 0 {
		old := ps.tab.Load()
		for i := range t.pins {
			if old != nil && old.pins[i] != nil {
				t.pins[i] = old.pins[i]
			} else {
				t.pins[i] = newPins()
			}
		}
	}
	ps.sp = sp
	ps.tab.Store(t)
}

// decision is what to do with one new flow.
type decision struct {
	action servicelb.Action
	set    int
	t      *table
}

// decide returns the verdict for a new flow from src to a frontend of
// kind k at local, which came in on the interface in names (see
// node.origin). A flow from outside a load-balancer frontend's source
// ranges is dropped.
func (ps *portState) decide(nd *node, k servicelb.FrontendKind, src, local netip.Addr, in func() string) decision {
	t := ps.tab.Load()
	v := t.sp.Verdicts(k).Of(nd.origin(src, local, in))
	d := decision{action: v.Action, t: t}
	switch v.Action {
	case servicelb.ToCluster:
		d.set = clusterSet
	case servicelb.ToLocal:
		d.set = localSet
	default:
		return d
	}
	if k == servicelb.LoadBalancerFrontend && len(t.sp.SourceRanges) > 0 && !inPrefixes(t.sp.SourceRanges, src) {
		d.action = servicelb.Drop
		return d
	}
	if t.sets[d.set] == nil {
		d.action = servicelb.Drop // servicelb never forwards to an empty set
	}
	return d
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// choose picks an endpoint of the decision's set for client, not among
// tr: the one client is pinned to, if any, else one the scheduler picks
// (and pins). It returns -1 when every endpoint has been tried.
func choose(d decision, client netip.Addr, tr tried, now time.Time) int {
	set := d.t.sets[d.set]
	pins, timeout := d.t.pins[d.set], d.t.sp.Affinity
	if pins != nil {
		if to, ok := pins.get(client, now, timeout); ok {
			if i, ok := set.index[to]; ok && !tr.has(i) {
				return i
			}
		}
	}
	i := set.pick(tr)
	if i >= 0 && pins != nil {
		pins.set(client, set.backends[i].AddrPort(), now, timeout)
	}
	return i
}

// failed forgets client's pin to an endpoint it could not reach.
func failed(d decision, client netip.Addr, to netip.AddrPort) {
	if p := d.t.pins[d.set]; p != nil {
		p.drop(client, to)
	}
}
