//go:build linux

package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Backend is a dataplane under test.
type Backend struct {
	// Name names the backend in the test log.
	Name string
	// New returns a proxier that programs the network namespace ns: the
	// node's. The kit calls it once at the start and again for the
	// scenarios that restart the proxier, after closing the previous one
	// without Cleanup. It fails the test itself on error.
	New func(t testing.TB, ns netns.NsHandle) servicelb.Proxier
	// Cgroup, when set, is a cgroup v2 directory that the backend's
	// socket hooks are attached to. The asks from the node and from the
	// pod then run in a process inside it (netnstest.Cgroup), as the
	// node's own processes and its workloads would; the outside client
	// and the endpoint hosts ask from outside it, as hosts and workloads
	// the hooks do not see. For those asks a refusal at the socket (a
	// connect failing at once with ECONNREFUSED, no packet sent) counts
	// as Refused, as a drop at the socket (EPERM) counts as Dropped. The
	// package's TestMain must call Main.
	Cgroup string
	// Redirect, when set, says where a proxy that serves its frontends at
	// other addresses and ports (the userspace backend's listen-at mode,
	// which needs no privilege) serves the frontend at dst for protocol p:
	// every check then asks there instead of at dst, from the same origin.
	// ok false asks at dst itself.
	Redirect func(p servicelb.Protocol, dst netip.AddrPort) (at netip.AddrPort, ok bool)
}

// Options tune a run.
type Options struct {
	// Protocols are the protocols each check runs with when it names
	// none; default TCP and UDP. SCTP needs a kernel with SCTP.
	Protocols []servicelb.Protocol
	// Run, when set, is a regular expression: only the scenarios whose
	// names match run.
	Run string
	// NotApplicable names the scenarios the backend expects to be left
	// out: those its capabilities exclude (a feature it lacks, a
	// scheduler hint it does not honour), and those with a stage none of
	// whose checks runs over Protocols (a TCP-only check in an SCTP run).
	// Run fails when the scenarios it leaves out, among those Run
	// selects, are not exactly these: a scenario newly left out (a lost
	// feature) or one that now applies fails the test, and names what
	// changed.
	NotApplicable []string
	// DropTimeout is how long an ask that must be dropped waits for an
	// answer; default 400ms. AskTimeout bounds the others; default 2s.
	// Raise both under emulation.
	DropTimeout, AskTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if len(o.Protocols) == 0 {
		o.Protocols = []servicelb.Protocol{servicelb.TCP, servicelb.UDP}
	}
	if o.DropTimeout == 0 {
		o.DropTimeout = 400 * time.Millisecond
	}
	if o.AskTimeout == 0 {
		o.AskTimeout = 2 * time.Second
	}
	return o
}

// Topology of a run: backends 0 to Endpoints-1 serve the scenarios'
// services, and two more backend hosts, in the cluster CIDRs, are pods of
// the node: the pod that asks as FromPod (Pod), on a link of its own name
// (PodLink), and another behind the bridge PodBridge (BridgedPod).
const (
	// Endpoints is the number of endpoint hosts a scenario may use.
	Endpoints      = 3
	podHost        = Endpoints
	bridgedPodHost = Endpoints + 1
	// TargetPort is the port the endpoint hosts serve, and AltTargetPort a
	// second one.
	TargetPort    = 8080
	AltTargetPort = 8081
	// PodLinkPrefix starts the name of the node's link to Pod (PodLink):
	// the prefix of the InterfaceNamePrefix scenarios, which no other
	// link of the node shares.
	PodLinkPrefix = "pod"
	PodLink       = PodLinkPrefix + "0"
	// PodBridge is the bridge the node reaches BridgedPod through: the
	// interface of the BridgeInterface scenarios.
	PodBridge = "cbr0"
)

// Run drives the backend through every scenario that applies to it (see
// Scenarios), each as a subtest, in one throwaway topology: it needs root
// and the kernel features the backend needs. A scenario that needs a
// feature or scheduler the backend does not declare, or that has a stage
// none of whose checks runs over Options.Protocols, is not applicable: it
// is logged and not run, and the scenarios left out so must be the ones
// Options.NotApplicable names, or the test fails.
func Run(t *testing.T, b Backend, o Options) {
	o = o.withDefaults()
	var only *regexp.Regexp
	if o.Run != "" {
		only = regexp.MustCompile(o.Run)
	}
	l := newLab(t, b, o)
	caps := l.p.Capabilities()
	for _, a := range adaptations(&caps) {
		t.Logf("%s: %s", b.Name, a)
	}
	if _, ok := l.p.(servicelb.FlowChecker); !ok {
		t.Logf("%s gives no kernel's word on a flow (servicelb.FlowChecker): the explanations are checked against the packets alone", b.Name)
	}
	scs := Scenarios()
	selected := func(sc *Scenario) bool { return only == nil || only.MatchString(sc.Name) }
	left := leftOut(scs, &caps, o.Protocols, selected)
	if err := checkLeftOut(scs, o.NotApplicable, left, selected); err != nil {
		t.Errorf("%s: %v", b.Name, err)
	}
	for i, sc := range scs {
		if !selected(&sc) {
			continue
		}
		if why := left[sc.Name]; why != "" {
			t.Logf("%s: not applicable to %s: %s", sc.Name, b.Name, why)
			continue
		}
		t.Run(sc.Name, func(t *testing.T) { l.run(t, i+1, &sc) })
	}
	require.NoError(t, l.p.Cleanup(context.Background()), "Cleanup")
}

// leftOut returns the selected scenarios that do not apply to a backend
// with capabilities c in a run over protos, with why.
func leftOut(scs []Scenario, c *servicelb.Capabilities, protos []servicelb.Protocol, selected func(*Scenario) bool) map[string]string {
	out := map[string]string{}
	for i := range scs {
		if sc := &scs[i]; selected(sc) {
			if why := sc.inapplicable(c, protos); why != "" {
				out[sc.Name] = why
			}
		}
	}
	return out
}

// checkLeftOut compares the scenarios left out with those the backend
// expects to be (Options.NotApplicable), among the selected ones, and
// says what differs: a scenario left out that is not expected to be (with
// why), one expected that runs, or a name that is no scenario's.
func checkLeftOut(scs []Scenario, want []string, left map[string]string, selected func(*Scenario) bool) error {
	known := map[string]bool{}
	var errs []error
	for i := range scs {
		sc := &scs[i]
		known[sc.Name] = true
		if !selected(sc) {
			continue
		}
		why, out := left[sc.Name]
		switch expected := slices.Contains(want, sc.Name); {
		case out && !expected:
			errs = append(errs, fmt.Errorf("%s is not applicable (%s), and Options.NotApplicable does not list it", sc.Name, why))
		case !out && expected:
			errs = append(errs, fmt.Errorf("%s applies, and Options.NotApplicable lists it", sc.Name))
		}
	}
	for _, name := range want {
		if !known[name] {
			errs = append(errs, fmt.Errorf("Options.NotApplicable lists %q, which is no scenario", name))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	names := slices.Sorted(maps.Keys(left))
	return fmt.Errorf("the scenarios left out are not the expected ones:\n%w\n(left out now: %#v)", errors.Join(errs...), names)
}

// lab is the topology and the proxier under test.
type lab struct {
	b  Backend
	o  Options
	tp *netnstest.Topology
	p  servicelb.Proxier
	// caps are the backend's, as the first proxier declared them.
	caps servicelb.Capabilities
	// cg runs the asks of the node and the pod, with Backend.Cgroup.
	cg *netnstest.Cgroup
	// added are the client's extra addresses so far.
	added map[netip.Addr]bool
	// ports are the source ports of UDP and SCTP asks.
	ports askPorts
	// flows are the endpoints the kept sockets of the scenarios last
	// reached, by socket name.
	flows flowMemory
	// explains counts the flows checked against their explanation.
	explains explainer
}

// flowMemory remembers an endpoint per kept socket.
type flowMemory struct {
	mu sync.Mutex
	m  map[string]int
}

// get returns the endpoint last recorded for name, if any.
func (fm *flowMemory) get(name string) (at int, seen bool) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	at, seen = fm.m[name]
	return at, seen
}

// set records at as the endpoint of name.
func (fm *flowMemory) set(name string, at int) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	if fm.m == nil {
		fm.m = map[string]int{}
	}
	fm.m[name] = at
}

func newLab(t *testing.T, b Backend, o Options) *lab {
	t.Helper()
	features := []string{"veth", "bridge"}
	if slices.Contains(o.Protocols, servicelb.SCTP) {
		features = append(features, "sctp")
	}
	netnstest.Require(t, features...)
	tp := netnstest.New(t, netnstest.Options{Backends: Endpoints + 2, Links: map[int]netnstest.Link{
		podHost: {Name: PodLink}, bridgedPodHost: {Bridge: PodBridge},
	}})
	for _, h := range tp.Backends {
		for _, p := range o.Protocols {
			h.Serve(t, p.Lower(), TargetPort)
			h.Serve(t, p.Lower(), AltTargetPort)
		}
	}
	// The node's own flows to addresses it does not hold leave it as a
	// router's do: through the client's link.
	tp.Node.AddRoute(t, netip.Prefix{}, tp.Client.IPv4)
	tp.Node.AddRoute(t, netip.Prefix{}, tp.Client.IPv6)
	l := &lab{b: b, o: o, tp: tp, added: map[netip.Addr]bool{}}
	if b.Cgroup != "" {
		l.cg = netnstest.StartCgroup(t, b.Cgroup)
	}
	l.p = b.New(t, tp.Node.NS)
	l.caps = l.p.Capabilities()
	t.Cleanup(func() { l.close() })
	return l
}

func (l *lab) close() { _ = l.p.Close() }

// closeForGood closes the proxier for a restart, and checks that it
// refuses to work after: Sync and Cleanup return servicelb.ErrClosed,
// the one error every backend shares, and leave the kernel alone.
func (l *lab) closeForGood(t *testing.T) {
	t.Helper()
	require.NoError(t, l.p.Close(), "close the proxier for a restart")
	require.NoError(t, l.p.Close(), "close the proxier a second time")
	st, err := servicelb.NewState(baseNode())
	require.NoError(t, err)
	rep, err := l.p.Sync(t.Context(), st)
	assert.ErrorIs(t, err, servicelb.ErrClosed, "a Sync after Close")
	assert.Nil(t, rep.Applied, "a Sync after Close reports a state applied")
	assert.ErrorIs(t, l.p.Cleanup(t.Context()), servicelb.ErrClosed, "a Cleanup after Close")
}

// baseNode is the node every scenario starts from.
func baseNode() servicelb.NodeConfig {
	return servicelb.NodeConfig{
		NodeName:     NodeName,
		NodeIPs:      []netip.Addr{netnstest.NodeIPv4(), netnstest.NodeIPv6()},
		ClusterCIDRs: netnstest.ClusterCIDRs(),
	}
}

// run runs the stages of one scenario; idx makes its addresses its own.
func (l *lab) run(t *testing.T, idx int, sc *Scenario) {
	e := &Env{idx: idx, lab: l}
	for i, st := range sc.Stages {
		e.node = baseNode()
		if st.Node != nil {
			st.Node(&e.node, e)
		}
		if st.Before != nil {
			st.Before(t, e)
		}
		if st.Restart {
			l.closeForGood(t)
			l.p = l.b.New(t, l.tp.Node.NS)
		}
		state, err := servicelb.NewState(e.node, st.Services(e)...)
		require.NoError(t, err, "stage %d: the scenario's state", i)
		e.state = l.sync(t, i, &st, state)
		l.checkAll(t, e, st.Expect)
	}
	if l.explains.checkedIn(idx) == 0 {
		t.Errorf("no flow of the scenario was checked against its explanation")
	}
}

// task is one check for one family and protocol, from a resolved asker,
// with the explanation of its flow (nil for a session's established flow
// and for a custom check).
type task struct {
	c Check
	f servicelb.Family
	p servicelb.Protocol
	a asker
	x *explained
}

// maxParallel bounds the checks of a stage under way at once. The checks
// of a stage are independent: running them together costs the longest
// wait of a dropped flow once, not once per check.
const maxParallel = 16

// checkAll runs a stage's checks: the table's at once, then one after the
// other those that must not overlap: sticky ones (the first flows of two
// checks from one client to two frontends of one port would race for the
// client's pin, as they would under kube-proxy) and custom ones (which
// wait for timeouts to pass).
func (l *lab) checkAll(t *testing.T, e *Env, checks []Check) {
	t.Helper()
	var tasks []task
	for _, c := range checks {
		tasks = append(tasks, l.tasks(t, e, c)...)
	}
	alone := func(tk task) bool { return tk.c.Custom != nil || tk.c.Want.sticky }
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallel)
	for _, tk := range tasks {
		if alone(tk) {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l.checkOne(t, e, tk)
		})
	}
	wg.Wait()
	for _, tk := range tasks {
		switch {
		case tk.c.Custom != nil:
			tk.c.Custom(t, e, tk.f, tk.p)
		case alone(tk):
			l.checkOne(t, e, tk)
		}
	}
}

// sync applies a stage's state and, when the stage says so, checks that
// the proxier left services out (and that the capabilities refuse them
// too); the stage's checks then show the rest applied. It returns the
// state applied.
func (l *lab) sync(t *testing.T, i int, st *Stage, state *servicelb.State) *servicelb.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := l.p.Sync(ctx, state)
	require.NoError(t, err, "stage %d: Sync", i)
	require.NotNil(t, rep.Applied, "stage %d: Sync reports no state applied", i)
	if st.LeftOut == nil {
		require.Empty(t, rep.LeftOut, "stage %d: Sync left services out", i)
		require.Same(t, state, rep.Applied, "stage %d: Sync reports another state applied than the one given", i)
		return rep.Applied
	}
	require.NotEmpty(t, rep.LeftOut, "stage %d: Sync did not say which services it left out", i)
	for name, err := range rep.LeftOut {
		require.ErrorIs(t, err, st.LeftOut, "stage %d: service %s left out", i, name)
		var ve *servicelb.ValidationError
		require.ErrorAs(t, err, &ve, "stage %d: the error of service %s left out names no service and field", i, name)
		require.Equal(t, name, ve.Service, "stage %d: the error of service %s left out names another service", i, name)
	}
	for _, svc := range state.Services() {
		_, applied := rep.Applied.Service(svc.Name)
		_, out := rep.LeftOut[svc.Name]
		require.NotEqual(t, applied, out, "stage %d: service %s is reported both applied and left out, or neither", i, svc.Name)
	}
	b := state.Edit()
	require.ErrorIs(t, b.Require(l.p.Capabilities()), st.LeftOut, "stage %d: the capabilities accept what Sync leaves out", i)
	return rep.Applied
}

// tasks returns a check's tasks: one for each family and protocol it
// applies to, with its asker ready and its flow explained.
func (l *lab) tasks(t *testing.T, e *Env, c Check) []task {
	t.Helper()
	fams := c.Families
	if fams == nil {
		fams = []servicelb.Family{servicelb.IPv4, servicelb.IPv6}
	}
	protos := l.o.Protocols
	if c.Proto != "" {
		if !c.runsOver(protos) {
			return nil
		}
		protos = []servicelb.Protocol{c.Proto}
	}
	var out []task
	for _, f := range fams {
		for _, p := range protos {
			tk := task{c: c, f: f, p: p}
			if c.Custom == nil {
				tk.a = l.asker(t, c.From, f)
				tk.x = l.explain(t, e, tk.a, c.From, e.frontend(c.To, f), p, c.Session)
			}
			out = append(out, tk)
		}
	}
	return out
}

// asker is the host and source address a check asks from.
type asker struct {
	h    *netnstest.Host
	from netip.Addr // zero: the host's own
	// cg, when set, runs the asks in the backend's cgroup.
	cg *netnstest.Cgroup
}

func (l *lab) asker(t *testing.T, fr From, f servicelb.Family) asker {
	t.Helper()
	switch fr.kind() {
	case fromOutside:
		if fr.n() == 0 {
			// The client's own address, not an extra one that source
			// address selection might prefer.
			own := l.tp.Client.IPv4
			if f == servicelb.IPv6 {
				own = l.tp.Client.IPv6
			}
			return asker{h: l.tp.Client, from: own}
		}
		a := outsideAddr(f, fr.n())
		if !l.added[a] {
			l.tp.Client.AddAddress(t, netip.PrefixFrom(a, map[servicelb.Family]int{servicelb.IPv4: 24, servicelb.IPv6: 64}[f]))
			l.added[a] = true
		}
		return asker{h: l.tp.Client, from: a}
	case fromPod:
		return asker{h: l.tp.Backends[podHost], cg: l.cg}
	case fromBridgedPod:
		return asker{h: l.tp.Backends[bridgedPodHost], cg: l.cg}
	case fromNode:
		return asker{h: l.tp.Node, cg: l.cg}
	}
	return asker{h: l.tp.Backends[fr.n()]}
}

// outsideAddr is the n-th extra address of the client, on its link.
func outsideAddr(f servicelb.Family, n int) netip.Addr {
	if f == servicelb.IPv4 {
		return netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + n)})
	}
	b := netnstest.ClientIPv6().As16()
	b[15] = byte(100 + n)
	return netip.AddrFrom16(b)
}

func (l *lab) checkOne(t *testing.T, e *Env, tk task) {
	t.Helper()
	c, f, p, a := tk.c, tk.f, tk.p, tk.a
	dst := e.resolve(c.To, f, p)
	what := fmt.Sprintf("%s %s from %s to %s %s", f, p.Lower(), c.From, c.To, dst)
	if tk.x != nil {
		if msg := tk.x.disagreement(c); msg != "" {
			t.Error(explainFailure(what, msg, tk.x))
		}
		l.checkKernel(t, tk.x, what)
	}
	w := c.Want
	switch {
	case w.kind == reach:
		l.expectReach(t, a, p, dst, c, tk.x, what)
	case l.resets(p):
		l.expectReset(t, a, p, dst, c, what)
	case w.kind == refused:
		err := l.ask1(a, p, dst, c.Session, l.o.DropTimeout, netnstest.WatchICMP())
		var ae *netnstest.AskError
		if !(errors.Is(err, netnstest.ErrRefused) || errors.Is(err, netnstest.ErrFiltered)) || !errors.As(err, &ae) {
			t.Errorf("%s: %v, want refused with an ICMP port unreachable", what, errText(err))
		} else if ae.ICMP == nil || !ae.ICMP.PortUnreachable() {
			t.Errorf("%s: refused by %v, want an ICMP port unreachable", what, refusalText(ae))
		}
	case w.kind == dropped:
		err := l.ask1(a, p, dst, c.Session, l.o.DropTimeout, netnstest.WatchICMP())
		var ae *netnstest.AskError
		// A flow of the node's own that the node drops as it leaves fails
		// its send or connect at once (EPERM), as under kube-proxy's
		// rules; anyone else's is met with silence: a pod's socket that
		// fails at once was refused by something else than a dropped
		// packet.
		local := c.From.kind() == fromNode && errors.Is(err, netnstest.ErrFiltered) && errors.As(err, &ae) && ae.ICMP == nil
		if !errors.Is(err, netnstest.ErrTimeout) && !local {
			t.Errorf("%s: %v, want dropped (no answer)", what, errText(err))
		}
	}
}

// resets reports whether the backend resets the flows of protocol p that
// a verdict rejects or drops (it lacks servicelb.FeaturePacketVerdicts,
// and p is TCP or SCTP) instead of answering with an ICMP error or not at
// all.
func (l *lab) resets(p servicelb.Protocol) bool {
	return !l.caps.Features.Has(servicelb.FeaturePacketVerdicts) && p != servicelb.UDP
}

// expectReset checks that a flow is refused by a reset (an SCTP abort),
// with no ICMP error and no endpoint answering; a flow that must be
// dropped may also go unanswered (what the node does not take in is
// dropped by the network, not reset).
func (l *lab) expectReset(t *testing.T, a asker, p servicelb.Protocol, dst netip.AddrPort, c Check, what string) {
	t.Helper()
	err := l.ask1(a, p, dst, c.Session, l.o.DropTimeout, netnstest.WatchICMP())
	var ae *netnstest.AskError
	switch {
	case c.Want.kind == dropped && errors.Is(err, netnstest.ErrTimeout):
	case !errors.Is(err, netnstest.ErrRefused) || !errors.As(err, &ae):
		t.Errorf("%s: %v, want refused with a reset (the backend lacks %s)", what, errText(err), servicelb.FeaturePacketVerdicts)
	case ae.ICMP != nil:
		t.Errorf("%s: refused by %v, want a reset (the backend lacks %s)", what, ae.ICMP, servicelb.FeaturePacketVerdicts)
	}
}

// adaptations says how the checks change for a backend that lacks a
// feature some checks describe: one line each.
func adaptations(c *servicelb.Capabilities) []string {
	var out []string
	if !c.Features.Has(servicelb.FeaturePreserveSource) {
		out = append(out, fmt.Sprintf("lacks %s: checks that want the client's address kept want the node's instead", servicelb.FeaturePreserveSource))
	}
	if !c.Features.Has(servicelb.FeaturePacketVerdicts) {
		out = append(out, fmt.Sprintf("lacks %s: TCP and SCTP checks that want an ICMP error want a reset instead, and those that want silence a reset or silence", servicelb.FeaturePacketVerdicts))
	}
	return out
}

func errText(err error) string {
	if err == nil {
		return "answered"
	}
	return err.Error()
}

func refusalText(ae *netnstest.AskError) string {
	if ae.ICMP == nil {
		return "a reset (no ICMP error)"
	}
	return ae.ICMP.String()
}

func (l *lab) askOpts(a asker, p servicelb.Protocol, session uint16, timeout time.Duration, extra ...netnstest.AskOption) []netnstest.AskOption {
	opts := append([]netnstest.AskOption{netnstest.Timeout(timeout)}, extra...)
	if a.from.IsValid() {
		opts = append(opts, netnstest.FromAddr(a.from))
	}
	switch {
	case session != 0:
		opts = append(opts, netnstest.FromPort(session))
	case p != servicelb.TCP:
		opts = append(opts, netnstest.FromPort(l.ports.next(a.h.Name, p)))
	}
	if a.cg != nil {
		opts = append(opts, netnstest.InCgroup(a.cg))
	}
	return opts
}

func (l *lab) ask1(a asker, p servicelb.Protocol, dst netip.AddrPort, session uint16, timeout time.Duration, extra ...netnstest.AskOption) error {
	_, err := a.h.Ask(context.Background(), p.Lower(), dst, l.askOpts(a, p, session, timeout, extra...)...)
	return err
}

// Source ports of the UDP and SCTP asks. Conntrack keeps the entry of a
// finished UDP flow for 30 s and of a closed SCTP association for 10 s,
// and a new flow with the same tuple takes it up with its translation:
// a port the kernel picked at random again would meet the verdict of an
// earlier stage, not the current one. (TCP needs none of this: a SYN on
// a closed entry replaces it.) So each host's asks of each protocol
// take the ports of a range in turn, above the namespaces' ephemeral
// range (ip_local_port_range ends at 60999), below which nothing the
// kit serves listens; a port comes round again only after
// askPortCount asks of the same host and protocol.
const (
	askPortFirst = 61000
	askPortCount = 65536 - askPortFirst
)

// askPorts hands out the source ports of asks, per host and protocol.
type askPorts struct {
	mu   sync.Mutex
	offs map[string]uint16 // the next port's offset in the range, by host and protocol
}

func (ap *askPorts) next(host string, p servicelb.Protocol) uint16 {
	ap.mu.Lock()
	defer ap.mu.Unlock()
	if ap.offs == nil {
		ap.offs = map[string]uint16{}
	}
	k := host + "/" + p.Lower()
	n := ap.offs[k]
	ap.offs[k] = (n + 1) % askPortCount
	return askPortFirst + n
}

// expectReach asks as often as the outcome needs and checks who answered
// and with which source address, and that the explanation x (when not
// nil) allows each answer.
func (l *lab) expectReach(t *testing.T, a asker, p servicelb.Protocol, dst netip.AddrPort, c Check, x *explained, what string) {
	t.Helper()
	w := c.Want
	n := w.asks()
	counts := map[int]int{}
	for range n {
		r, err := a.h.Ask(context.Background(), p.Lower(), dst, l.askOpts(a, p, c.Session, l.o.AskTimeout)...)
		if err != nil {
			t.Errorf("%s: %v, want an answer from endpoint %v (answers so far: %v)", what, err, w.backends, counts)
			return
		}
		i := hostIndex(r.Host)
		if !slices.Contains(w.backends, i) {
			t.Errorf("%s: answered by %s, want one of endpoints %v", what, r.Host, w.backends)
			return
		}
		if w.port != 0 && r.Port != w.port {
			t.Errorf("%s: answered by %s on port %d, want port %d", what, r.Host, r.Port, w.port)
			return
		}
		counts[i]++
		source := w.source
		if source == preserved && !l.caps.Features.Has(servicelb.FeaturePreserveSource) {
			source = masqueraded
		}
		if msg := l.sourceMismatch(a, source, i, r.Client.Addr()); msg != "" {
			t.Errorf("%s: answered by %s seeing the client as %s: %s", what, r.Host, r.Client.Addr(), msg)
			return
		}
		if x != nil {
			if msg := l.answerDisagrees(x, a, i, r.Client.Addr()); msg != "" {
				t.Error(explainFailure(fmt.Sprintf("%s: answered by %s seeing the client as %s", what, r.Host, r.Client.Addr()), msg, x))
				return
			}
		}
	}
	w.judge(t, what, counts, n)
}

func hostIndex(name string) int {
	var i int
	if _, err := fmt.Sscanf(name, "backend-%d", &i); err != nil {
		return -1
	}
	return i
}

// sourceMismatch says what is wrong with the client address an endpoint
// saw, or "".
func (l *lab) sourceMismatch(a asker, want sourceRule, endpoint int, seen netip.Addr) string {
	gw := l.tp.Backends[endpoint].Gateway4
	if seen.Is6() {
		gw = l.tp.Backends[endpoint].Gateway6
	}
	switch {
	case want == masqueraded && seen != gw:
		return fmt.Sprintf("want masqueraded to the node's %s", gw)
	case want == preserved && seen == gw:
		return "want the client's own address, not the node's"
	case want == preserved && a.h != l.tp.Node:
		own := a.from
		if !own.IsValid() {
			own = a.h.IPv4
			if seen.Is6() {
				own = a.h.IPv6
			}
		}
		if seen != own {
			return fmt.Sprintf("want the client's own %s", own)
		}
	}
	return ""
}

// scenarioName returns a name usable in service names.
func scenarioName(idx int) string { return fmt.Sprintf("s%d", idx) }

// hostList formats endpoint indexes as "backend-0,backend-2".
func hostList(is []int) string {
	var names []string
	for _, i := range is {
		names = append(names, fmt.Sprintf("backend-%d", i))
	}
	return strings.Join(names, ",")
}
