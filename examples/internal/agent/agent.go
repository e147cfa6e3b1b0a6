package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/healthcheck"
	"github.com/kproxy-dev/kproxy/ipvs"
	"github.com/kproxy-dev/kproxy/nodeaddr"
	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// Source feeds services into the runner: a file, Kubernetes, Consul.
type Source interface {
	// Name names the source in logs and metrics.
	Name() string
	// Run feeds dst until ctx ends, then returns nil. It calls dst.Synced
	// once its initial contents are in, and reports each object it must
	// skip as invalid through report, naming the object.
	Run(ctx context.Context, dst *servicelb.Source, report Reporter) error
}

// Reporter is told about an object a source skipped, and why.
type Reporter = func(object string, err error)

// NodeWatcher is a Source that also follows this node's own object, as
// kube-proxy watches its Node: while NodeEligible says the node may not
// take traffic (it is being deleted, say), the proxy's /healthz answers
// 503, with nodeEligible false, so that load balancers stop sending it
// traffic before it goes.
type NodeWatcher interface {
	Source
	NodeEligible() bool
}

// NodeFollower is a Source that also learns facts of this node (its
// addresses, zone, pod CIDRs, the cluster's service CIDRs) and follows
// them, as kube-proxy reads its Node: before Run, the agent hands it
// update, which the source calls with an edit of the node config each
// time they change; the agent applies it to the runner (SetNode), and an
// edit the runner refuses is logged and changes nothing.
type NodeFollower interface {
	Source
	FollowNode(update func(edit func(*servicelb.NodeConfig)))
}

// Options configure an Agent.
type Options struct {
	Config Config
	Logger *slog.Logger
	// Stdout receives dry-run output; default os.Stdout.
	Stdout io.Writer
	// Dataplane, when set, replaces the backend Config names (tests use
	// servicelb/fake).
	Dataplane Dataplane
	// OnInvalid, when set, is told about every object a source skips as
	// invalid, besides the log and the metrics.
	OnInvalid Reporter
}

// Agent drives a backend from sources through a servicelb.Runner.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	dp      servicelb.Proxier
	runner  *servicelb.Runner
	metrics *Metrics
	ns      netns.NsHandle
	// node is the node config; LocalIPs follow the namespace's addresses
	// (nodeaddr) while Run runs, and NodeFollowers edit the rest. nodeMu
	// orders the edits.
	nodeMu sync.Mutex
	node   servicelb.NodeConfig
	// proxyHealth judges and serves the proxy's health; services serves
	// the health check node ports, nil when off.
	proxyHealth *healthcheck.Proxy
	services    *healthcheck.Services
	healthErrs  map[string]string // ports not opened, by service: reported once
	// watchers are the sources that judge the node's eligibility, set by
	// Run before it serves the proxy's health.
	watchers []NodeWatcher

	first     chan error // the first sync's result, for --once
	firstOnce sync.Once
	onInvalid Reporter
	// inspect keeps what /state tells beyond the runner's state.
	inspect inspection
	// others is the backend options the other backends are cleaned up
	// with after the first successful sync; nil when that is not the
	// agent's job (a dry run, a dataplane given in Options).
	others     *BackendOptions
	othersOnce sync.Once
}

// New checks the configuration, opens the backend (probing the kernel's
// support for it unless it is a dry run) and builds the runner.
func New(o Options) (*Agent, error) {
	a := &Agent{cfg: o.Config, log: o.Logger, ns: netns.None(), first: make(chan error, 1), onInvalid: o.OnInvalid}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	node, err := a.cfg.Node()
	if err != nil {
		return nil, err
	}
	if err := a.openNS(); err != nil {
		return nil, err
	}
	if !a.cfg.DryRun && o.Dataplane == nil {
		if err := a.tuneConntrack(); err != nil {
			a.Close()
			return nil, err
		}
	}
	if !a.cfg.DryRun {
		// The first sync serves node ports on every address already;
		// Run follows the changes.
		if node.LocalIPs, err = nodeaddr.List(a.addrOptions()); err != nil {
			a.Close()
			return nil, fmt.Errorf("node addresses: %w", err)
		}
	}
	a.node = node
	if err := a.openDataplane(o, node); err != nil {
		a.Close()
		return nil, err
	}
	a.metrics = NewMetrics(a.cfg.Backend, a.health)
	if s, ok := a.dp.(portStatser); ok {
		a.metrics.Registry.MustRegister(newPortStatsCollector(s))
	}
	if err := a.openHealth(node); err != nil {
		a.Close()
		return nil, err
	}
	ro := a.cfg.RunnerOptions(node)
	ro.Logger = a.log
	ro.Hooks = a.hooks()
	if a.runner, err = servicelb.NewRunner(a.dp, ro); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// tuneConntrack applies the --conntrack-* settings in the agent's
// namespace, as kube-proxy does at start.
func (a *Agent) tuneConntrack() error {
	ns := a.ns
	if !ns.IsOpen() {
		ns = 0
	}
	changed, err := a.cfg.Conntrack.Apply(ns)
	for _, c := range changed {
		a.log.Info("conntrack setting changed", "sysctl", c.Name, "value", c.Value, "was", c.Old)
	}
	if err != nil {
		return fmt.Errorf("--conntrack-*: %w", err)
	}
	return nil
}

// addrOptions says whose addresses are the node's: the agent's
// namespace, but the addresses of an IPVS proxier's dummy link or of the
// loopback a userspace proxier holds service addresses on.
func (a *Agent) addrOptions() nodeaddr.Options {
	ns := a.ns
	if !ns.IsOpen() {
		ns = 0
	}
	o := nodeaddr.Options{NetNS: ns, Logger: a.log}
	switch a.cfg.Backend {
	case "ipvs":
		o.ExcludeInterfaces = []string{ipvs.DefaultInterface}
	case "userspace":
		// The proxy holds the service addresses on the loopback.
		o.ExcludeInterfaces = []string{userspace.DefaultLink}
	}
	return o
}

// followAddresses keeps the node's LocalIPs equal to the addresses of the
// namespace's interfaces (those of an IPVS proxier's dummy link left
// out), so that node ports are served on an address from the sync after
// it appears, until ctx ends.
func (a *Agent) followAddresses(ctx context.Context) error {
	w := nodeaddr.Watcher{Options: a.addrOptions()}
	return w.Run(ctx, func(addrs []netip.Addr) {
		if a.updateNode(func(n *servicelb.NodeConfig) { n.LocalIPs = addrs }) {
			a.log.Info("node addresses", "addresses", addrs)
		}
	})
}

// updateNode applies an edit of the node config to the runner, and
// reports whether the runner took it; one it refuses is logged and
// changes nothing.
func (a *Agent) updateNode(edit func(*servicelb.NodeConfig)) bool {
	a.nodeMu.Lock()
	defer a.nodeMu.Unlock()
	node := a.node
	node.NodeIPs = slices.Clone(node.NodeIPs)
	node.LocalIPs = slices.Clone(node.LocalIPs)
	node.ServiceCIDRs = slices.Clone(node.ServiceCIDRs)
	node.DetectLocal.NodeCIDRs = slices.Clone(node.DetectLocal.NodeCIDRs)
	edit(&node)
	if err := a.runner.SetNode(node); err != nil {
		a.log.Error("a change of the node is refused", "err", err)
		return false
	}
	a.node = node
	return true
}

func (a *Agent) openNS() error {
	ns, err := openNetNS(a.cfg.NetNS)
	if err != nil {
		return err
	}
	a.ns = ns
	return nil
}

// openHealth prepares the proxy's health and, unless a dry run or turned
// off, the services' health check node ports, served in the agent's
// namespace on the node-port addresses as kube-proxy serves them: those
// --nodeport-addresses selects, else every address.
func (a *Agent) openHealth(node servicelb.NodeConfig) error {
	var err error
	a.proxyHealth, err = healthcheck.NewProxy(healthcheck.ProxyOptions{
		Health: a.health, Addr: a.cfg.HealthzBindAddress, NetNS: a.ns, Timeout: a.cfg.HealthTimeout(), Logger: a.log,
		Answered: a.metrics.ProxyAnswered, NodeEligible: a.nodeEligible,
	})
	if err != nil {
		return err
	}
	if !a.cfg.ServiceHealthChecks || a.cfg.DryRun {
		return nil
	}
	var addrs []netip.Addr
	if len(node.NodePortAddresses) > 0 || node.NodePortPrimary {
		for _, a := range append(node.NodePortIPs(servicelb.IPv4), node.NodePortIPs(servicelb.IPv6)...) {
			if a != netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
				addrs = append(addrs, a)
			}
		}
	}
	a.services = healthcheck.NewServices(healthcheck.ServicesOptions{
		NetNS: a.ns, Addrs: addrs, ProxyHealthy: a.proxyHealth.Live, Logger: a.log,
	})
	a.healthErrs = map[string]string{}
	return nil
}

// syncHealth brings the health check node ports in line with an applied
// state, and reports a port it cannot open as an invalid object, once per
// distinct error.
func (a *Agent) syncHealth(st *servicelb.State) {
	if a.services == nil {
		return
	}
	err := a.services.Sync(st)
	failed := map[string]error{}
	for _, e := range splitErrors(err) {
		var le *healthcheck.ListenError
		if errors.As(e, &le) {
			failed[le.Service] = e
		} else {
			a.log.Error("health check node ports", "err", e)
		}
	}
	report := a.reporter("healthcheck")
	for name, e := range failed {
		if a.healthErrs[name] != e.Error() {
			a.healthErrs[name] = e.Error()
			report(name, e)
		}
	}
	for name := range a.healthErrs {
		if failed[name] == nil {
			delete(a.healthErrs, name)
		}
	}
}

// splitErrors returns the errors joined in err.
func splitErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (a *Agent) openDataplane(o Options, node servicelb.NodeConfig) error {
	uo, err := a.cfg.Userspace.Options()
	if err != nil {
		return err
	}
	bo := BackendOptions{NetNS: a.ns, Node: node, Logger: a.log, StrictARP: a.cfg.StrictARP, Cgroup: a.cfg.Cgroup, PinPath: a.cfg.BPFPinPath,
		ConntrackTCPLiberal: a.cfg.Conntrack.TCPBeLiberal, Userspace: &uo, UserspaceHandover: a.cfg.Userspace.HandoverSocket}
	out := o.Stdout
	if out == nil {
		out = os.Stdout
	}
	switch {
	case o.Dataplane != nil && a.cfg.DryRun:
		a.dp = &dryRun{r: o.Dataplane, name: a.cfg.Backend, w: out}
	case o.Dataplane != nil:
		a.dp = o.Dataplane
	case a.cfg.DryRun:
		r, err := OpenRenderer(a.cfg.Backend, bo)
		if err != nil {
			return err
		}
		a.dp = &dryRun{r: r, name: a.cfg.Backend, w: out}
	default:
		d, err := Open(a.cfg.Backend, bo)
		if err != nil {
			return err
		}
		a.dp = d
		if a.cfg.Backend == "userspace" && unprivileged(bo) {
			// Without privileges it could remove nothing of theirs.
			break
		}
		a.others = &bo
	}
	return nil
}

// cleanupOthers removes what the other backends own in the namespace, as
// kube-proxy removes the rules of its other modes when it starts: once the
// first sync is in, so that the old rules serve until the new ones do.
// A backend whose kernel support is missing owns nothing and is skipped;
// so are those whose objects the running one uses (ebpf's nftables
// table).
func (a *Agent) cleanupOthers() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range others(a.cfg.Backend) {
		o := *a.others
		o.Logger = a.log.With("backend", name)
		err := Cleanup(ctx, name, o)
		switch {
		case skipped(err):
			a.log.Debug("other backend not cleaned up: nothing of it can be here", "backend", name, "reason", err)
		case err != nil:
			a.log.Error("removing another backend's rules", "backend", name, "err", err)
		default:
			a.log.Debug("other backend cleaned up", "backend", name)
		}
	}
}

func (a *Agent) hooks() servicelb.Hooks {
	h := a.metrics.Hooks()
	applied := h.Applied
	h.Applied = func(st *servicelb.State) {
		applied(st)
		a.syncHealth(st)
		a.inspect.served(st)
	}
	synced := h.Synced
	h.Synced = func(r servicelb.SyncResult) {
		synced(r)
		a.inspect.synced(r)
		if r.Err == nil && a.others != nil {
			a.othersOnce.Do(a.cleanupOthers)
		}
		a.firstOnce.Do(func() { a.first <- r.Err })
	}
	// A service that asks for a frontend another holds is served without
	// it: reported as the part of it that is left out.
	report := a.reporter("conflict")
	h.Conflicts = func(cs []servicelb.Conflict) {
		for _, c := range cs {
			for _, loser := range c.Losers {
				report(loser, c.Err())
			}
		}
	}
	// A service the backend refuses is left out of the kernel, the rest
	// applied: reported as an invalid object of the backend.
	refused := a.reporter("backend")
	h.LeftOut = func(m map[string]error) {
		for name, err := range m {
			refused(name, err)
		}
	}
	return h
}

// nodeEligible reports whether every source that follows the node finds
// it eligible for traffic; true without one.
func (a *Agent) nodeEligible() bool {
	for _, w := range a.watchers {
		if !w.NodeEligible() {
			return false
		}
	}
	return true
}

func (a *Agent) health() servicelb.Health {
	if a.runner == nil {
		return servicelb.Health{}
	}
	return a.runner.Health()
}

// applied returns the state the backend last applied; nil before the
// first sync.
func (a *Agent) applied() *servicelb.State {
	if a.runner == nil {
		return nil
	}
	return a.runner.Applied()
}

// Runner returns the agent's runner.
func (a *Agent) Runner() *servicelb.Runner { return a.runner }

// Dataplane returns the proxier the runner drives: the backend, or in a
// dry run the printer.
func (a *Agent) Dataplane() servicelb.Proxier { return a.dp }

// Metrics returns the agent's metrics.
func (a *Agent) Metrics() *Metrics { return a.metrics }

// Close closes the health check node ports, releases the backend's
// sockets and the namespace handle. The kernel state stays (see
// Config.CleanupOnExit).
func (a *Agent) Close() {
	if a.services != nil {
		_ = a.services.Close()
	}
	if a.dp != nil {
		if err := a.dp.Close(); err != nil {
			a.log.Warn("closing the backend", "err", err)
		}
	}
	if a.ns.IsOpen() {
		a.ns.Close()
		a.ns = netns.None()
	}
}

// Run runs the sources and the runner until ctx ends, a source fails, or,
// with --once, the first sync is done. With CleanupOnExit it then removes
// the backend's rules.
func (a *Agent) Run(ctx context.Context, sources ...Source) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.watchers = nil
	for _, s := range sources {
		if w, ok := s.(NodeWatcher); ok {
			a.watchers = append(a.watchers, w)
		}
		if f, ok := s.(NodeFollower); ok {
			f.FollowNode(func(edit func(*servicelb.NodeConfig)) { a.updateNode(edit) })
		}
	}
	var wg sync.WaitGroup
	if a.cfg.MetricsAddr != "" && !a.cfg.DryRun {
		if err := a.serveMetrics(ctx, &wg); err != nil {
			return err
		}
	}
	if a.cfg.HealthzBindAddress != "" && !a.cfg.DryRun {
		wg.Go(func() {
			if err := a.proxyHealth.Run(ctx); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("--healthz-bind-address: %w", err))
			}
		})
	}
	if !a.cfg.DryRun {
		wg.Go(func() {
			if err := a.followAddresses(ctx); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("node addresses: %w", err))
			}
		})
	}
	// Every source is registered before the runner and the sources run:
	// a runner that knew only the sources started so far would sync as
	// soon as they delivered, a state without the others' services.
	dsts := make([]*servicelb.Source, len(sources))
	for i, s := range sources {
		dsts[i] = a.runner.Source(s.Name())
	}
	wg.Go(func() { _ = a.runner.Run(ctx) })
	for i, s := range sources {
		dst := dsts[i]
		report := a.reporter(s.Name())
		wg.Go(func() {
			if err := s.Run(ctx, dst, report); err != nil && ctx.Err() == nil {
				cancel(fmt.Errorf("source %s: %w", s.Name(), err))
			}
		})
	}
	if a.cfg.Once {
		wg.Go(func() {
			select {
			case err := <-a.first:
				cancel(errOnce{err})
			case <-ctx.Done():
			}
		})
	}
	if h, ok := a.dp.(handoverServer); ok && !a.cfg.DryRun && !a.cfg.Once {
		wg.Go(func() {
			if err := h.serveHandover(ctx); err == nil {
				cancel(errHandedOver)
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	if a.services != nil {
		_ = a.services.Close()
	}
	err := context.Cause(ctx)
	var once errOnce
	switch {
	case errors.Is(err, errHandedOver):
		// The newer process serves with this one's sockets and
		// addresses: nothing of them is cleaned up.
		return nil
	case errors.As(err, &once):
		err = once.err
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		err = nil
	}
	return errors.Join(err, a.cleanup())
}

// errHandedOver ends Run once a newer process took the dataplane's
// sockets (--userspace-handover-socket).
var errHandedOver = errors.New("handed over to a newer process")

type errOnce struct{ err error }

func (e errOnce) Error() string { return "first sync done" }

func (a *Agent) cleanup() error {
	if !a.cfg.CleanupOnExit || a.cfg.DryRun {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.dp.Cleanup(ctx); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	a.log.Info("removed the installed rules")
	return nil
}

func (a *Agent) reporter(source string) Reporter {
	return func(object string, err error) {
		a.metrics.Invalid(source)
		a.inspect.leave(object, source, err)
		a.log.Error(leftOutMessage(source), "source", source, "object", object, "err", err)
		if a.onInvalid != nil {
			a.onInvalid(object, err)
		}
	}
}

// leftOutMessage says what became of an object a source reports: a clash
// serves the service without the frontend another holds, a refusal of the
// backend leaves the service's ports out of the kernel, anything else was
// invalid and is skipped.
func leftOutMessage(source string) string {
	switch source {
	case "conflict":
		return "service served without a frontend another service holds"
	case "backend":
		return "service ports left out: the backend refused them"
	}
	return "skipping invalid object"
}

// exposed reports whether a listener on addr takes connections from
// other hosts: it is not on a loopback address.
func exposed(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return !ok || !tcp.IP.IsLoopback()
}

// MetricsMaxConns bounds the connections the metrics server holds at
// once: a scraper takes one, a person with curl another.
const MetricsMaxConns = 64

func (a *Agent) serveMetrics(ctx context.Context, wg *sync.WaitGroup) error {
	ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", Handler(a.metrics, a.cfg.Backend, a.health, a.cfg.HealthTimeout()))
	inspect := inspectHandler(a.cfg, &a.inspect, a.applied, a.dp)
	for _, path := range []string{"/configz", "/state", "/explain", "/trace"} {
		mux.Handle(path, inspect)
	}
	var h http.Handler = mux
	if a.cfg.Profiling {
		h = withProfiling(h)
	}
	// pprof's profile and trace move their write deadline on by the
	// duration asked for.
	srv := healthcheck.NewHTTPServer(h, nil)
	if a.cfg.Profiling {
		if exposed(ln.Addr()) {
			a.log.Warn("profiling is served to the network: /debug/pprof/ reads the process's command line "+
				"and its profiles cost processor time; bind --metrics-bind-address to a loopback address", "addr", ln.Addr().String())
		}
	}
	limited := healthcheck.LimitListener(ln, MetricsMaxConns, func(shed uint64) {
		a.log.Warn("closing new connections at once: the server holds its most", "server", "metrics", "maxConns", MetricsMaxConns, "shed", shed)
	})
	a.log.Info("serving metrics", "addr", ln.Addr().String(), "profiling", a.cfg.Profiling)
	wg.Go(func() { _ = srv.Serve(limited) })
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Close()
	})
	return nil
}
