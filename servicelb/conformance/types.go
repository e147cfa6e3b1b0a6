//go:build linux

package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Scenario is one behaviour of a Service, checked with real packets: one or
// more stages, each a state to sync and what packets must then do.
type Scenario struct {
	// Name names the subtest.
	Name string
	// Follows names the kube-proxy code whose behaviour the scenario
	// checks (or says that it is kproxy's own).
	Follows string
	// Needs are the features the backend must declare for the scenario to
	// apply; Scheduler, when set, a scheduler hint it must honour.
	Needs     servicelb.Features
	Scheduler servicelb.Scheduler
	// Refuses, when set, makes the scenario apply only to backends that
	// do NOT honour some scheduler hint: see Env.UnsupportedScheduler.
	Refuses bool
	// Bounded, when set, makes the scenario apply only to backends with a
	// bound on the endpoints of a service port.
	Bounded bool
	Stages  []Stage
}

// inapplicable says why the scenario does not apply to a backend with
// capabilities c in a run over protos, or "".
func (sc *Scenario) inapplicable(c *servicelb.Capabilities, protos []servicelb.Protocol) string {
	switch {
	case !c.Features.Has(sc.Needs):
		return fmt.Sprintf("needs %s, which the backend lacks", sc.Needs&^c.Features)
	case sc.Scheduler != "" && !c.AcceptsScheduler(sc.Scheduler):
		return fmt.Sprintf("needs scheduler %q", sc.Scheduler)
	case sc.Refuses && unsupportedScheduler(c) == "":
		return "the backend honours every scheduler hint"
	case sc.Bounded && c.MaxEndpoints == 0:
		return "the backend has no bound on endpoints"
	}
	for i, st := range sc.Stages {
		if len(st.Expect) > 0 && !slices.ContainsFunc(st.Expect, func(c Check) bool { return c.runsOver(protos) }) {
			return fmt.Sprintf("stage %d has no check over %v", i, protos)
		}
	}
	return ""
}

// runsOver reports whether the check runs in a run over protos: it names
// no protocol, or one of them.
func (c Check) runsOver(protos []servicelb.Protocol) bool {
	return c.Proto == "" || slices.Contains(protos, c.Proto)
}

// unsupportedScheduler returns a scheduler hint c does not honour, or "".
func unsupportedScheduler(c *servicelb.Capabilities) servicelb.Scheduler {
	for _, s := range servicelb.Schedulers() {
		if !c.AcceptsScheduler(s) {
			return s
		}
	}
	return ""
}

// Stage is one state of a scenario and its checks.
type Stage struct {
	// Node edits the node config; the base is NodeName "node", the node's
	// addresses as NodeIPs and the cluster CIDRs of the topology, with the
	// default local-traffic detection (by the cluster CIDRs). Set
	// DetectLocal to another with Env.NodeCIDRs, PodLinkPrefix or
	// PodBridge.
	Node func(n *servicelb.NodeConfig, e *Env)
	// Services returns the services to sync.
	Services func(e *Env) []servicelb.Service
	// Before runs before the sync (to add an address to the node, or to
	// wait).
	Before func(t *testing.T, e *Env)
	// Restart replaces the proxier with a new one (Backend.New) before
	// the sync, leaving the kernel state as it is, as an agent restart does.
	Restart bool
	// LeftOut, when set, is the error kind the sync must leave services
	// out for: its report names them (servicelb.SyncReport.LeftOut), each
	// with an error of that kind naming it, and the rest of the state is
	// applied.
	LeftOut error
	// Expect are the checks, run after the sync.
	Expect []Check
}

// Check is one expectation: new flows from an origin to a frontend, for
// each of the families and protocols it applies to.
type Check struct {
	From From
	To   Target
	// Families default to both; Proto to each of Options.Protocols.
	Families []servicelb.Family
	Proto    servicelb.Protocol
	// Session, when set, is the source port of every ask: the asks of
	// all checks with one Session share a UDP or SCTP flow's tuple, as one
	// client session's datagrams do.
	Session uint16
	Want    Outcome
	// Custom, when set, replaces From, To and Want: it checks what the
	// table cannot say.
	Custom func(t *testing.T, e *Env, f servicelb.Family, p servicelb.Protocol)
}

// From is the origin of a check's flows: one of the constants Outside,
// Pod, Node and BridgedPod, or a value of OutsideAt or Endpoint.
type From uint32

// The kind of origin is a From's low byte, the number of the host or
// address the bytes above it.
func (f From) kind() fromKind { return fromKind(f & 0xff) }
func (f From) n() int         { return int(f >> 8) }

func from(k fromKind, n int) From { return From(k) | From(n)<<8 }

type fromKind uint8

const (
	fromOutside fromKind = iota
	fromPod
	fromNode
	fromEndpoint
	fromBridgedPod
)

// The origins: Outside is the client outside the cluster CIDRs
// (198.51.100.2, fd00:c::2), Pod a workload host of this node inside them
// that is not an endpoint (10.244.4.2, fd00:244:4::2, in the node's pod
// CIDRs, Env.NodeCIDRs, on the node's link PodLink), Node the node
// itself. BridgedPod is another workload host of this node in the cluster
// CIDRs but outside the node's pod CIDRs (10.244.5.2, fd00:244:5::2),
// which the node reaches through the bridge PodBridge: the interface
// detections tell the two pods apart.
const (
	Outside    = From(fromOutside)
	Pod        = From(fromPod)
	Node       = From(fromNode)
	BridgedPod = From(fromBridgedPod)
)

// OutsideAt is the outside client using its n-th extra address
// (198.51.100.(100+n), fd00:c::(100+n)), n from 1.
func OutsideAt(n int) From { return from(fromOutside, n) }

// Endpoint is endpoint host i itself asking (hairpin).
func Endpoint(i int) From { return from(fromEndpoint, i) }

func (f From) String() string {
	switch f.kind() {
	case fromOutside:
		if f.n() > 0 {
			return fmt.Sprintf("outside#%d", f.n())
		}
		return "outside"
	case fromPod:
		return "pod"
	case fromNode:
		return "node"
	case fromBridgedPod:
		return "bridged pod"
	}
	return fmt.Sprintf("endpoint %d", f.n())
}

// Target is a frontend of a scenario's service: one of the constants
// ClusterIP, NodePort, ..., with Of and OnPort.
type Target uint64

// A Target's low byte is its kind, the next three the service's number,
// and the two above them the port when not zero (OnPort), instead of the
// service's.
func (t Target) kind() targetKind { return targetKind(t & 0xff) }
func (t Target) svc() int         { return int(t >> 8 & 0xffffff) }
func (t Target) port() uint16     { return uint16(t >> 32) }

type targetKind uint8

const (
	toClusterIP targetKind = iota
	toNodePort
	toExternalIP
	toLoadBalancerIP
	toUnallocated
	toLocalNodePort
	toLocalhostNodePort
	toHealthCheckNodePort
)

// The frontends of service 0; Of picks another service.
const (
	ClusterIP      = Target(toClusterIP)
	NodePort       = Target(toNodePort)
	ExternalIP     = Target(toExternalIP)
	LoadBalancerIP = Target(toLoadBalancerIP)
	// Unallocated is an address of the service CIDRs (see Env.ServiceCIDRs)
	// that is no service's cluster IP.
	Unallocated = Target(toUnallocated)
	// LocalNodePort is the node port on the node's other local address
	// (see Env.LocalIP), which a stage puts on the node.
	LocalNodePort = Target(toLocalNodePort)
	// LocalhostNodePort is the node port on 127.0.0.1 (IPv4 only), for
	// the node's own clients.
	LocalhostNodePort = Target(toLocalhostNodePort)
	// HealthCheckNodePort is the service's health check node port (see
	// Env.HealthCheckNodePortOf) on the node's address: no frontend of
	// the proxier's, a port the node itself serves.
	HealthCheckNodePort = Target(toHealthCheckNodePort)
)

// Of returns the same frontend of service i of the scenario.
func (t Target) Of(i int) Target { return t&^(0xffffff<<8) | Target(i&0xffffff)<<8 }

// OnPort returns the frontend's address with another port.
func (t Target) OnPort(p uint16) Target { return t&^(0xffff<<32) | Target(p)<<32 }

func (t Target) String() string {
	name := [...]string{"cluster IP", "node port", "external IP", "load-balancer IP", "unallocated service IP",
		"node port on another local address", "node port on localhost", "health check node port"}[t.kind()]
	if t.svc() > 0 {
		name += fmt.Sprintf(" of service %d", t.svc())
	}
	if t.port() != 0 {
		name += fmt.Sprintf(" port %d", t.port())
	}
	return name
}

// Outcome is what a check's flows must do.
type Outcome struct {
	kind     outcomeKind
	backends []int
	source   sourceRule
	spread   bool
	sticky   bool
	shares   map[int]float64
	port     uint16
}

type outcomeKind uint8

const (
	reach outcomeKind = iota
	refused
	dropped
)

type sourceRule uint8

const (
	anySource sourceRule = iota
	preserved
	masqueraded
)

// Reach says every flow reaches one of the endpoint hosts given.
func Reach(endpoints ...int) Outcome { return Outcome{kind: reach, backends: endpoints} }

// Refused says every flow is refused at once with an ICMP (ICMPv6) port
// unreachable, TCP included (a reset, for TCP and SCTP, on a backend
// without servicelb.FeaturePacketVerdicts).
func Refused() Outcome { return Outcome{kind: refused} }

// Dropped says every flow goes unanswered (or, for TCP and SCTP on a
// backend without servicelb.FeaturePacketVerdicts, is reset).
func Dropped() Outcome { return Outcome{kind: dropped} }

// Masqueraded adds that the endpoint sees the node's address on its link
// as the client.
func (o Outcome) Masqueraded() Outcome { o.source = masqueraded; return o }

// Preserved adds that the endpoint sees the client's own address (the
// node's, on a backend without servicelb.FeaturePreserveSource).
func (o Outcome) Preserved() Outcome { o.source = preserved; return o }

// OnPort adds that every answer comes from the endpoint's port p
// (TargetPort or AltTargetPort).
func (o Outcome) OnPort(p uint16) Outcome { o.port = p; return o }

// Spread adds that every endpoint given answers some of 40 flows.
func (o Outcome) Spread() Outcome { o.spread = true; return o }

// Sticky adds that one endpoint answers all of 12 flows.
func (o Outcome) Sticky() Outcome { o.sticky = true; return o }

// Shares adds that 300 flows spread over the endpoints in proportion to
// the shares, within bounds a correct random spread leaves with
// probability below 1e-6.
func (o Outcome) Shares(shares map[int]float64) Outcome { o.shares = shares; return o }

func (o Outcome) asks() int {
	switch {
	case o.shares != nil:
		return 300
	case o.spread:
		return 40
	case o.sticky:
		return 12
	}
	return 6
}

// judge checks the spread of the answers.
func (o Outcome) judge(t *testing.T, what string, counts map[int]int, n int) {
	t.Helper()
	switch {
	case o.sticky && len(counts) != 1:
		t.Errorf("%s: answered by %v, want one endpoint throughout", what, counts)
	case o.spread && len(counts) != len(o.backends):
		t.Errorf("%s: answered by %v of %d flows, want each of %s", what, counts, n, hostList(o.backends))
	case o.shares != nil:
		byName, shares := map[string]int{}, map[string]float64{}
		for i, c := range counts {
			byName[fmt.Sprintf("backend-%d", i)] = c
		}
		for i, s := range o.shares {
			shares[fmt.Sprintf("backend-%d", i)] = s
		}
		if err := netnstest.WithinBounds(byName, netnstest.WeightedShares(shares), n); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
}

// Env gives a scenario's stages their addresses and the lab's hosts. Each
// scenario has addresses and node ports of its own, so that no flow of one
// scenario meets the state of another.
type Env struct {
	idx  int
	lab  *lab
	node servicelb.NodeConfig
	// state is the state the proxier applied in the current stage.
	state *servicelb.State
}

// NodeName is the node's name: endpoints with it are local.
const NodeName = "node"

// Remote is the name of another node, for endpoints that are not local.
const Remote = "elsewhere"

// Node returns the node config of the current stage.
func (e *Env) Node() servicelb.NodeConfig { return e.node }

// Host returns the host of endpoint i, for stages that act on it.
func (e *Env) Host(i int) *Host { return newHost(e.lab.tp.Backends[i]) }

// NodeHost returns the node's host.
func (e *Env) NodeHost() *Host { return newHost(e.lab.tp.Node) }

// Host is a host of the topology, the node or an endpoint host, for the
// stages that act on one.
type Host struct {
	// Name is the host's name, which its echo servers answer with:
	// "node", "backend-0", ...
	Name string

	h *netnstest.Host
}

func newHost(h *netnstest.Host) *Host { return &Host{Name: h.Name, h: h} }

// Do runs f on an OS thread switched into the host's network namespace and
// returns its error; the calling goroutine's thread never changes
// namespace. Sockets made in f stay in the namespace after it returns;
// goroutines f starts do not run in it. f must not call t.FailNow.
func (h *Host) Do(f func() error) error { return h.h.Do(f) }

// Serve starts an echo server for proto ("tcp", "udp" or "sctp") on port,
// on every address of the host, until the test ends.
func (h *Host) Serve(t testing.TB, proto string, port uint16) { h.h.Serve(t, proto, port) }

// AddAddress adds an address to the host until the test ends: on lo for
// the node, on its link to the node for an endpoint host.
func (h *Host) AddAddress(t testing.TB, p netip.Prefix) { h.h.AddAddress(t, p) }

// Reply is an answer to an ask.
type Reply struct {
	// Host is the name of the host that answered.
	Host string
	// Client is the client's address and port as the server saw them:
	// the client's own when its source address is preserved, the node's
	// address on the endpoint's link when it is masqueraded.
	Client netip.AddrPort
	// Port is the port the server answered on.
	Port uint16
}

// ErrRefused and ErrTimeout are the kinds of a failed ask:
// errors.Is(err, ErrRefused) for a flow refused (an ICMP unreachable, a TCP
// reset or an SCTP abort), errors.Is(err, ErrTimeout) for one unanswered.
var (
	ErrRefused = netnstest.ErrRefused
	ErrTimeout = netnstest.ErrTimeout
)

// Families returns the families the scenarios serve.
func Families() []servicelb.Family { return []servicelb.Family{servicelb.IPv4, servicelb.IPv6} }

func (e *Env) addr(f servicelb.Family, v4 [2]byte, v6 uint16, i int) netip.Addr {
	if f == servicelb.IPv4 {
		return netip.AddrFrom4([4]byte{v4[0], v4[1], byte(e.idx), byte(10 + i)})
	}
	var b [16]byte
	b[0], b[1], b[2], b[3] = 0xfd, 0x00, byte(v6>>8), byte(v6)
	b[13], b[14], b[15] = byte(e.idx>>8), byte(e.idx), byte(10+i)
	return netip.AddrFrom16(b)
}

// ClusterIP returns service i's cluster IP of family f: 10.96.<scenario>.(10+i)
// or fd00:96::<scenario>:(10+i)-like.
func (e *Env) ClusterIP(f servicelb.Family, i int) netip.Addr {
	return e.addr(f, [2]byte{10, 96}, 0x96, i)
}

// ExternalIP returns service i's external IP of family f.
func (e *Env) ExternalIP(f servicelb.Family, i int) netip.Addr {
	return e.addr(f, [2]byte{172, 16}, 0xe, i)
}

// LoadBalancerIP returns service i's load-balancer IP of family f.
func (e *Env) LoadBalancerIP(f servicelb.Family, i int) netip.Addr {
	return e.addr(f, [2]byte{172, 17}, 0xb, i)
}

// LocalIP returns an address of family f that a scenario may put on the
// node besides its primary ones (see LocalNodePort and AddLocalIP).
func (e *Env) LocalIP(f servicelb.Family) netip.Addr {
	return e.addr(f, [2]byte{172, 18}, 0x1a, 0)
}

// AddLocalIP puts LocalIP of both families on the node's link to the
// client, and lists them in the stage's node config as NodeConfig.LocalIPs
// (as package nodeaddr would report them): use it in Stage.Before, with
// Stage.Node setting LocalIPs from Env.LocalIP.
func AddLocalIP(t *testing.T, e *Env) {
	for _, f := range Families() {
		a := e.LocalIP(f)
		e.NodeHost().AddAddress(t, netip.PrefixFrom(a, a.BitLen()))
	}
}

// ServiceCIDRs returns the service CIDRs of the scenario: its cluster IPs
// and the address Unallocated names.
func (e *Env) ServiceCIDRs() []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(e.ClusterIP(servicelb.IPv4, 0), 24).Masked(),
		netip.PrefixFrom(e.ClusterIP(servicelb.IPv6, 0), 120).Masked(),
	}
}

// NodePortOf returns service i's node port: the same for every protocol.
func (e *Env) NodePortOf(i int) uint16 { return uint16(30000 + e.idx*8 + i) }

// HealthCheckNodePortOf returns service i's health check node port (i
// from 0 to 3), among the scenario's node ports.
func (e *Env) HealthCheckNodePortOf(i int) uint16 { return e.NodePortOf(7 - i) }

// ServicePort is the port of every service of the scenarios.
const ServicePort = 80

// NodeCIDRs returns the node's pod CIDRs, for the NodeCIDR detection: the
// subnets of Pod (10.244.4.0/24, fd00:244:4::/64). The endpoints and
// BridgedPod lie outside them, in the cluster CIDRs.
func (e *Env) NodeCIDRs() []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(netnstest.BackendIPv4(podHost), 24).Masked(),
		netip.PrefixFrom(netnstest.BackendIPv6(podHost), 64).Masked(),
	}
}

// NodeIP returns the node's address of family f.
func (e *Env) NodeIP(f servicelb.Family) netip.Addr {
	if f == servicelb.IPv4 {
		return netnstest.NodeIPv4()
	}
	return netnstest.NodeIPv6()
}

// Protocols returns the protocols of the run.
func (e *Env) Protocols() []servicelb.Protocol { return e.lab.o.Protocols }

// UnsupportedScheduler returns a scheduler hint the backend does not
// honour.
func (e *Env) UnsupportedScheduler() servicelb.Scheduler {
	c := e.lab.p.Capabilities()
	return unsupportedScheduler(&c)
}

// resolve returns the address and port a check asks at for a target:
// its frontend's, or where Backend.Redirect puts it.
func (e *Env) resolve(t Target, f servicelb.Family, p servicelb.Protocol) netip.AddrPort {
	dst := e.frontend(t, f)
	if r := e.lab.b.Redirect; r != nil {
		if at, ok := r(p, dst); ok {
			return at
		}
	}
	return dst
}

// frontend returns a target's address and port.
func (e *Env) frontend(t Target, f servicelb.Family) netip.AddrPort {
	port := uint16(ServicePort)
	var a netip.Addr
	switch t.kind() {
	case toClusterIP:
		a = e.ClusterIP(f, t.svc())
	case toNodePort:
		a, port = e.NodeIP(f), e.NodePortOf(t.svc())
	case toExternalIP:
		a = e.ExternalIP(f, t.svc())
	case toLoadBalancerIP:
		a = e.LoadBalancerIP(f, t.svc())
	case toUnallocated:
		a = e.ClusterIP(f, 200)
	case toLocalNodePort:
		a, port = e.LocalIP(f), e.NodePortOf(t.svc())
	case toLocalhostNodePort:
		a, port = netip.AddrFrom4([4]byte{127, 0, 0, 1}), e.NodePortOf(t.svc())
	case toHealthCheckNodePort:
		a, port = e.NodeIP(f), e.HealthCheckNodePortOf(t.svc())
	}
	if t.port() != 0 {
		port = t.port()
	}
	return netip.AddrPortFrom(a, port)
}

// Ask makes one ask from an origin to a target, for custom checks. A
// failed ask's error names the flow; ErrRefused and ErrTimeout tell its
// kind. An answer must be one the explanation of the flow allows (see
// the package documentation), or the test fails.
func (e *Env) Ask(t *testing.T, from From, to Target, f servicelb.Family, p servicelb.Protocol) (Reply, error) {
	t.Helper()
	a := e.lab.asker(t, from, f)
	x := e.lab.explain(t, e, a, from, e.frontend(to, f), p, 0)
	dst := e.resolve(to, f, p)
	r, err := a.h.Ask(t.Context(), p.Lower(), dst, e.lab.askOpts(a, p, 0, e.lab.o.AskTimeout)...)
	if err == nil {
		if msg := e.lab.answerDisagrees(x, a, hostIndex(r.Host), r.Client.Addr()); msg != "" {
			what := fmt.Sprintf("%s %s from %s to %s %s: answered by %s seeing the client as %s", f, p.Lower(), from, to, dst, r.Host, r.Client.Addr())
			t.Error(explainFailure(what, msg, x))
		}
	}
	e.lab.checkKernel(t, x, fmt.Sprintf("%s %s from %s to %s %s", f, p.Lower(), from, to, dst))
	return Reply(r), err
}

// Sleep waits d: for stages that let a timeout pass.
func Sleep(d time.Duration) func(*testing.T, *Env) {
	return func(*testing.T, *Env) { time.Sleep(d) }
}
