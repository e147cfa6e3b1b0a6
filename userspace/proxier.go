//go:build linux

package userspace

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/rtnl"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier serves service ports from user space. It implements
// servicelb.Proxier and servicelb.Renderer. Its methods are safe for
// concurrent use.
type Proxier struct {
	o     Options
	log   *slog.Logger
	socks sockets
	pipes pipePool
	// routes tells the interfaces of SCTP flows.
	routes routes
	// node tells origins apart, for the data path.
	node atomic.Pointer[node]
	// broken counts the listeners whose goroutine failed since the last
	// sync that wrote the whole state; dirty is set when a sync failed
	// part way. Either makes the next sync write the whole state.
	broken atomic.Int32
	dirty  atomic.Bool
	// now is the clock of affinity pins; tests replace it.
	now func() time.Time
	// budget bounds the flows (see budget.go).
	budget budget
	// replies waits for the UDP sessions' replies (see replies.go).
	replies replies

	mu        sync.Mutex
	eng       *syncer.Engine
	nodeCfg   servicelb.NodeConfig
	ports     map[servicelb.ServicePortKey]*portState
	listeners map[listenKey]*listener
	held      *holder // nil without HoldAddresses
	rt        *rtnl.Conn
	closed    bool
	// takeover is Options.TakeOver until the first sync has taken the
	// old process's connections; inherited are its listening sockets
	// the first sync has not used yet. handedOver is set once HandOver
	// gave this proxy's sockets away.
	takeover   *net.UnixConn
	inherited  map[listenKey]int
	handedOver bool
	// renderOnly is set by ForRendering: nothing is held.
	renderOnly bool

	// wg counts the proxy's goroutines: listeners, connections, and the
	// one of the UDP sessions' replies.
	wg sync.WaitGroup
	// starting counts the connections accepted and not yet open (being
	// made to their endpoint), which HandOver waits for.
	starting sync.WaitGroup
	// conns are the open connections, for Close.
	connMu  sync.Mutex
	conns   map[*conn]struct{}
	closing bool
}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// ForRendering returns a Proxier for o that holds nothing and needs no
// privilege: its Render and Capabilities answer as New's would, and its
// Sync and Cleanup return ErrRenderOnly.
func ForRendering(o Options) (*Proxier, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Proxier{o: o, log: slog.New(slog.DiscardHandler), renderOnly: true}
	if o.Logger != nil {
		p.log = o.Logger
	}
	return p, nil
}

// New returns a Proxier for the options. It changes nothing: the first
// Sync opens the listeners (and, with HoldAddresses, adopts the addresses
// an earlier proxy left marked). HoldAddresses without CAP_NET_ADMIN, and
// a NetNS other than the caller's without CAP_SYS_ADMIN, fail at once with
// an error that names the capability and wraps servicelb.ErrPermission.
func New(o Options) (*Proxier, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.HoldAddresses {
		if err := privilege.Require("userspace: Options.HoldAddresses", privilege.NetAdmin); err != nil {
			return nil, err
		}
	}
	if otherNS(o.NetNS) {
		if err := privilege.Require("userspace: Options.NetNS (another network namespace)", privilege.SysAdmin); err != nil {
			return nil, err
		}
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.MaxFlows == 0 {
		o.MaxFlows = DefaultMaxFlows()
	}
	if o.MaxPortFlows == 0 {
		o.MaxPortFlows = max(o.MaxFlows/2, 1)
	}
	p := &Proxier{o: o, log: log, pipes: pipePool{size: pipeSize}, now: time.Now,
		budget: budget{max: int64(o.MaxFlows), portMax: int64(o.MaxPortFlows)},
		ports:  map[servicelb.ServicePortKey]*portState{}, listeners: map[listenKey]*listener{}, conns: map[*conn]struct{}{}}
	p.node.Store(newNode(servicelb.NodeConfig{}))
	p.routes.ns = o.NetNS
	if otherNS(o.NetNS) {
		if p.socks.ns, err = startNSThread(o.NetNS); err != nil {
			return nil, fmt.Errorf("userspace: %w", err)
		}
	}
	if o.HoldAddresses {
		if p.rt, err = rtnl.Open(o.NetNS); err != nil {
			p.stopThread()
			return nil, fmt.Errorf("userspace: %w", err)
		}
		p.held = newHolder(p.rt, o.Link, o.AddressProtocol)
	}
	p.eng = syncer.New((*engine)(p), syncer.Options{Name: "userspace", Logger: log, Capabilities: p.Capabilities()})
	if o.TakeOver != nil {
		if err := p.takeListeners(o.TakeOver); err != nil {
			p.log.Warn("no handover: serving afresh", "err", err)
			for _, fd := range p.inherited {
				unix.Close(fd)
			}
			p.inherited = nil
			o.TakeOver.Close()
		} else {
			p.takeover = o.TakeOver
		}
	}
	return p, nil
}

// otherNS reports whether a namespace option names a namespace: zero
// and netns.None() mean the caller's.
func otherNS(ns netns.NsHandle) bool { return ns != 0 && ns.IsOpen() }

func (p *Proxier) stopThread() {
	if p.socks.ns != nil {
		p.socks.ns.stop()
		p.socks.ns = nil
	}
}

// Capabilities says what the proxy serves: every protocol and feature but
// source preservation (an endpoint sees the proxy's address), packet
// verdicts (a TCP or SCTP flow it rejects or drops is reset), the drop of
// unallocated service addresses (it holds addresses, it routes no
// prefixes), and the refusal of undefined ports of cluster IPs unless it
// holds the cluster IPs where they listen (Options.HoldAddresses without
// Options.Listen: the kernel refuses a port nothing listens on); the
// schedulers random (the default, weighted) and rr and wrr (smooth
// weighted round robin); any number of endpoints.
func (p *Proxier) Capabilities() servicelb.Capabilities {
	lacks := servicelb.FeaturePreserveSource | servicelb.FeaturePacketVerdicts | servicelb.FeatureServiceCIDRs |
		servicelb.FeatureFreePorts | servicelb.FeatureLingeringFlows
	if !p.o.HoldAddresses || p.o.Listen != nil {
		lacks |= servicelb.FeatureUndefinedPorts
	}
	if p.o.HoldAddresses && !p.o.StrictARP {
		lacks |= servicelb.FeatureNoARPAnswers
	}
	return servicelb.Capabilities{
		Backend:    "userspace",
		Schedulers: []servicelb.Scheduler{servicelb.SchedulerRandom, servicelb.SchedulerRoundRobin, servicelb.SchedulerWeightedRR},
		Features:   servicelb.AllFeatures &^ lacks,
	}
}

// Sync makes the listeners (and held addresses) match st. See the package
// documentation.
func (p *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.renderOnly {
		return servicelb.SyncReport{}, fmt.Errorf("userspace: sync: %w", ErrRenderOnly)
	}
	if p.handedOver {
		return servicelb.SyncReport{}, fmt.Errorf("userspace: sync: %w: the proxy handed its sockets over", ErrHandover)
	}
	rep, err := p.eng.Sync(ctx, st)
	if p.takeover != nil {
		n, terr := p.takeConns(p.takeover)
		if terr != nil {
			p.log.Warn("handover ended early", "connections", n, "err", terr)
		} else {
			p.log.Info("took over", "connections", n)
		}
		p.takeover.Close()
		p.takeover = nil
	}
	return rep, err
}

// Cleanup closes every listener and connection, releases the pipes kept
// for connections to come and removes the addresses the proxy holds (and
// the dummy link it created). It keeps the namespace's thread and the
// netlink socket, for a later Sync, which serves again; Close releases
// them.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.renderOnly {
		return fmt.Errorf("userspace: cleanup: %w", ErrRenderOnly)
	}
	if p.closed {
		return ErrClosed
	}
	p.eng.Forget()
	p.stopAll()
	p.pipes.close() // the spare pipes: a later Sync makes new ones
	p.connMu.Lock()
	p.closing = false
	p.connMu.Unlock()
	if p.held == nil {
		return nil
	}
	if err := p.held.removeAll(ctx); err != nil {
		return fmt.Errorf("userspace: cleanup: %w", err)
	}
	p.log.Info("cleaned up")
	return nil
}

// Close closes every listener and connection and returns when the
// proxy's goroutines have. It leaves the held addresses, for a later
// Proxier to adopt.
func (p *Proxier) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.renderOnly {
		return nil
	}
	p.eng.Close()
	p.stopAll()
	p.pipes.close()
	p.routes.close()
	var err error
	if p.rt != nil {
		err = p.rt.Close()
	}
	p.stopThread()
	return err
}

// stopAll closes the listeners, aborts the connections and waits for
// every goroutine.
func (p *Proxier) stopAll() {
	for _, l := range p.listeners {
		l.close()
	}
	for _, ps := range p.ports {
		ps.gone.Store(true)
	}
	p.listeners = map[listenKey]*listener{}
	p.ports = map[servicelb.ServicePortKey]*portState{}
	p.connMu.Lock()
	p.closing = true
	open := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.connMu.Unlock()
	for _, c := range open {
		c.abort()
	}
	p.stopReplies()
	p.wg.Wait()
	p.broken.Store(0)
	if p.held != nil {
		p.held.refs = map[netip.Addr]int{}
	}
}

// Stats returns the counters of every service port served, ordered by
// key.
func (p *Proxier) Stats() []PortStats {
	p.mu.Lock()
	out := make([]PortStats, 0, len(p.ports))
	for _, ps := range p.ports {
		out = append(out, ps.stats.snapshot(ps.key, ps.proto))
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b PortStats) int { return a.Key.Compare(b.Key) })
	return out
}

// leftOut returns the error that leaves a service out for one of its
// ports.
func leftOut(sp *servicelb.ServicePort, field string, err error) error {
	if errors.Is(err, errListenTaken) || errors.Is(err, unix.EADDRINUSE) {
		err = fmt.Errorf("%w: %w", servicelb.ErrFrontendTaken, err)
	}
	return &servicelb.ValidationError{Service: sp.Key.Service, Field: field, Err: err}
}

func portField(sp *servicelb.ServicePort) string {
	return fmt.Sprintf("ports[%q]", cmp.Or(sp.Port.Name, fmt.Sprint(sp.Port.Port)))
}

// activeConns returns the number of TCP and SCTP connections open.
func (p *Proxier) activeConns() int64 {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	return int64(len(p.conns))
}

// Render returns what the proxy would serve for st, one service port at a
// time: the addresses it holds, and for each listener the frontend it
// serves, the verdicts by origin and the endpoints. It needs no
// privileges and touches nothing.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	if err := st.Check(); err != nil {
		return "", fmt.Errorf("userspace: render: %w", err)
	}
	caps, n := p.Capabilities(), st.Node()
	if err := caps.CheckNode(&n); err != nil {
		return "", err
	}
	pl := newPlanner(&p.o, n, nil)
	var b strings.Builder
	var errs []error
	taken := map[listenKey]string{}
	held := map[netip.Addr]bool{}
	for _, sp := range st.Ports() {
		if err := caps.CheckPort(sp); err != nil {
			errs = append(errs, err)
			continue
		}
		fs, err := pl.fronts(sp)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range fs {
			if other, ok := taken[f.key]; ok {
				errs = append(errs, leftOut(sp, portField(sp), &ListenError{Protocol: f.key.proto, At: f.key.at.String(),
					Err: fmt.Errorf("%w (by %s)", errListenTaken, other)}))
				continue
			}
			taken[f.key] = sp.Key.String()
			if f.hold {
				held[f.key.at.Addr()] = true
			}
		}
		renderPort(&b, sp, fs)
	}
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	var head strings.Builder
	head.WriteString("# kproxy userspace proxy\n")
	for _, a := range slices.SortedFunc(maps.Keys(held), netip.Addr.Compare) {
		fmt.Fprintf(&head, "hold %s on %s\n", a, p.o.Link)
	}
	return head.String() + b.String(), nil
}
