//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/internal/nsutil"
	"github.com/kproxy-dev/kproxy/internal/privilege"
	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Proxier balances the connections and datagrams of the sockets in a
// cgroup at the socket layer. It implements servicelb.Proxier and
// servicelb.Renderer; its methods are safe for concurrent use.
type Proxier struct {
	opts  Options
	log   *slog.Logger
	caps  servicelb.Capabilities
	specs map[string]*ebpf.MapSpec

	mu      sync.Mutex
	eng     *syncer.Engine
	maps    *kmaps
	progs   []*ebpf.Program
	links   []link.Link // by hooks' index; nil until attached
	fresh   []bool      // links adopted from pins and not yet given this process's programs
	cgID    uint64
	cookie  uint64
	madeDir bool
	// mapDir holds the maps' pins, under PinPath, named after their
	// layout; retired is set once the pins of other layouts are gone.
	mapDir  string
	retired bool
	// packetsLeftOut names, sorted, the services the packet path left
	// out in the last Sync: the maps are not given them first.
	packetsLeftOut []string
	// blindWarned is set once a warning said some processes' sockets
	// cannot be looked at (see staleSockets).
	blindWarned bool
	// model is what the maps hold, by service port; nil before the first
	// sync and after Cleanup.
	model *model
}

var (
	_ servicelb.Proxier  = (*Proxier)(nil)
	_ servicelb.Renderer = (*Proxier)(nil)
)

// New probes the kernel (see Probe), then creates the maps or adopts
// those pinned under Options.PinPath, and loads the programs. It attaches
// nothing: the first Sync fills the maps, then attaches the hooks (or
// gives adopted links the new programs, atomically). Maps of another
// layout (pinned by another version, or with other Options.Sizes) are
// left to the hooks that read them until then: New makes its own beside
// them, and the first Sync removes their pins once every hook runs its
// programs. A map pinned in its own layout's place that it cannot read
// is a *PinError that names it and the way out (RemovePins), and New
// leaves every pin as it was.
func New(o Options) (*Proxier, error) {
	p, err := newProxier(o)
	if err != nil {
		return nil, err
	}
	if err := Probe(o); err != nil {
		return nil, err
	}
	if err := p.open(); err != nil {
		p.closeKernel()
		if pe := (*PinError)(nil); errors.As(err, &pe) {
			return nil, pe
		}
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	if err := privilege.Require("moving connected UDP sockets whose endpoint stops serving", privilege.SysPtrace); err != nil {
		p.log.Warn("connected UDP sockets will stay with endpoints that stop serving", "err", err)
	}
	return p, nil
}

// ForRendering returns a Proxier that renders (Render, Capabilities) and
// touches nothing: it needs no privileges and probes nothing, for dry
// runs. Its Sync, Cleanup and Dump fail with ErrRenderOnly.
func ForRendering(o Options) (*Proxier, error) { return newProxier(o) }

// newProxier checks the options and applies their defaults; the Proxier
// it returns renders but holds nothing of the kernel.
func newProxier(o Options) (*Proxier, error) {
	if o.Cgroup == "" {
		return nil, fmt.Errorf("ebpf: %w: Cgroup is empty: name a cgroup v2 directory", ErrInvalidOptions)
	}
	o.Sizes = o.Sizes.withDefaults()
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxier{opts: o, log: log.With("cgroup", o.Cgroup), specs: mapSpecs(o.Sizes)}
	if o.PinPath != "" {
		p.mapDir = filepath.Join(o.PinPath, mapDirPrefix+layoutName(p.specs))
	}
	p.caps = capabilities(o.Packets)
	p.eng = syncer.New((*engine)(p), syncer.Options{Name: "ebpf", Logger: p.log, VerifyInterval: o.VerifyInterval,
		Capabilities: p.caps, Cleaner: (*staleSockets)(p)})
	return p, nil
}

// open takes the kernel objects: the cgroup's id, the node namespace's
// cookie, the maps, the programs and the pinned links.
func (p *Proxier) open() error {
	var st unix.Stat_t
	if err := unix.Stat(p.opts.Cgroup, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", p.opts.Cgroup, err)
	}
	p.cgID = st.Ino
	cookie, err := netnsCookie(p.opts.NetNS)
	if err != nil {
		return err
	}
	p.cookie = cookie
	if p.opts.PinPath != "" {
		if _, err := os.Stat(p.opts.PinPath); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(p.opts.PinPath, 0o700); err != nil {
				return fmt.Errorf("pin path: %w", err)
			}
			p.madeDir = true
		}
		if err := os.MkdirAll(p.mapDir, 0o700); err != nil {
			return fmt.Errorf("pin path: %w", err)
		}
	}
	if p.maps, err = openMaps(p.specs, p.mapDir, p.opts.PinPath); err != nil {
		return err
	}
	for _, h := range hooks {
		spec := programSpec(h)
		for name, m := range p.maps.byName() {
			if err := spec.Instructions.AssociateMap(name, m); err != nil && !errors.Is(err, asm.ErrUnreferencedSymbol) {
				return fmt.Errorf("program %s: %w", h.name, err)
			}
		}
		prog, err := ebpf.NewProgram(spec)
		if err != nil {
			return fmt.Errorf("load program %s: %w", h.name, err)
		}
		p.progs = append(p.progs, prog)
	}
	p.links = make([]link.Link, len(hooks))
	p.fresh = make([]bool, len(hooks))
	if p.opts.PinPath == "" {
		return nil
	}
	for i, h := range hooks {
		l, err := link.LoadPinnedLink(p.linkPin(h), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pinned link %s: %w", h.name, err)
		}
		p.links[i], p.fresh[i] = l, true
	}
	return nil
}

func (p *Proxier) linkPin(h hook) string { return p.opts.PinPath + "/link_" + h.name }

// netnsCookie returns the cookie of a network namespace (SO_NETNS_COOKIE,
// Linux 5.14), which the hooks compare with bpf_get_netns_cookie.
func netnsCookie(ns netns.NsHandle) (uint64, error) {
	var cookie uint64
	err := nsutil.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, &FeatureError{Feature: "SO_NETNS_COOKIE", Hint: "Linux 5.14, to tell the node's sockets from pods'", Err: err}
	}
	return cookie, nil
}

// Close releases the Proxier's file descriptors. With a PinPath, the
// hooks and maps stay in the kernel for the next process; without one,
// the hooks are detached. It closes Options.Packets too, leaving its
// state in place.
func (p *Proxier) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.eng.Closed() {
		return nil
	}
	p.eng.Close()
	p.closeKernel()
	if p.opts.Packets != nil {
		return p.opts.Packets.Close()
	}
	return nil
}

func (p *Proxier) closeKernel() {
	for _, l := range p.links {
		if l != nil {
			l.Close()
		}
	}
	for _, prog := range p.progs {
		prog.Close()
	}
	if p.maps != nil {
		p.maps.close()
	}
	p.links, p.progs, p.maps = nil, nil, nil
}

// Capabilities says what the Proxier can express. Alone: TCP and UDP,
// the random scheduler (weighted), affinity with expiry, weights, the
// client's own address, at most MaxEndpoints endpoints per set. With
// Options.Packets: what both can, in the packet path's families, the
// packet path serving the rest (see the package documentation).
func (p *Proxier) Capabilities() servicelb.Capabilities { return p.caps }

// socketFeatures are the features the hooks give themselves. They tell a
// pod's socket from the node's by its network namespace inside the
// attached cgroup; under a local-traffic detection by interface they
// leave to the packet path the pods' flows whose verdict depends on it,
// so every mode is theirs (FeatureLocalByInterface included). They listen
// on no port (FeatureFreePorts) and hold no address (FeatureNoARPAnswers).
const socketFeatures = servicelb.FeatureAffinity | servicelb.FeatureWeights | servicelb.FeaturePreserveSource |
	servicelb.FeatureAffinityExpiry | servicelb.FeatureLocalByInterface | servicelb.FeatureFreePorts | servicelb.FeatureNoARPAnswers

// passedFeatures are the features whose flows the hooks leave to the
// packet path. In the pair the hooks leave it every reject and drop, so
// the pair's verdicts are the packet path's (FeaturePacketVerdicts); the
// hooks alone refuse at the socket (ECONNREFUSED, EPERM) and lack it.
const passedFeatures = servicelb.FeatureExternal | servicelb.FeatureSourceRanges | servicelb.FeatureServiceCIDRs |
	servicelb.FeatureUndefinedPorts | servicelb.FeatureLocalhostNodePorts | servicelb.FeaturePacketVerdicts

func capabilities(packets servicelb.Proxier) servicelb.Capabilities {
	c := servicelb.Capabilities{
		Backend:      "ebpf",
		Schedulers:   []servicelb.Scheduler{servicelb.SchedulerRandom},
		Protocols:    []servicelb.Protocol{servicelb.TCP, servicelb.UDP},
		MaxEndpoints: MaxEndpoints,
		Features:     socketFeatures,
	}
	if packets == nil {
		return c
	}
	pc := packets.Capabilities()
	c.Backend = "ebpf+" + pc.Backend
	c.Schedulers = slices.DeleteFunc(slices.Clone(c.Schedulers), func(s servicelb.Scheduler) bool { return !pc.AcceptsScheduler(s) })
	c.Protocols = pc.Protocols
	if pc.MaxEndpoints > 0 {
		c.MaxEndpoints = min(c.MaxEndpoints, pc.MaxEndpoints)
	}
	c.Features = pc.Features & (socketFeatures | passedFeatures)
	c.Families = pc.Families
	return c
}

// Sync makes the maps (and Options.Packets) match st. See the package
// documentation for what it writes and when. The maps sync first: a
// frontend the hooks do not know yet leaves a pod's connection
// untranslated, for the packet path to balance its own way (and, under
// session affinity, to pin where the hooks' pin of the pod's next
// connection need not be), so the hooks must know every frontend before
// the packet path serves it. Then the packet path syncs, and the maps
// come to hold what it applied (its SyncReport.Applied): a service it
// leaves out is taken out of the maps again, so that the node's sockets
// never reach a service the packet path does not serve, and the report
// names the services either half left out. When the packet path applies
// nothing, the maps go back to the state they held, the pair's last
// (on a first Sync they keep the new one, which serves the node's
// sockets until the packet path catches up). The halves of one Sync run
// under one lock: a concurrent Sync runs all of them before or after,
// never between.
func (p *Proxier) Sync(ctx context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.eng.Closed() {
		return servicelb.SyncReport{}, fmt.Errorf("ebpf: sync: %w", servicelb.ErrClosed)
	}
	if p.maps == nil {
		return servicelb.SyncReport{}, fmt.Errorf("ebpf: sync: %w", ErrRenderOnly)
	}
	if p.opts.Packets == nil {
		return p.eng.Sync(ctx, st)
	}
	prev, skipped := p.eng.Applied(), p.packetsLeftOut
	rep, err := p.eng.Sync(ctx, st.Without(skipped...))
	prep, perr := p.opts.Packets.Sync(ctx, st)
	if prep.Applied == nil {
		if prev != nil && rep.Applied != nil {
			_, rerr := p.eng.Sync(ctx, prev)
			err = errors.Join(err, rerr)
		}
		return prep, errors.Join(perr, err)
	}
	p.packetsLeftOut = slices.Sorted(maps.Keys(prep.LeftOut))
	full := rep.Full
	if !slices.Equal(skipped, p.packetsLeftOut) || rep.Applied == nil {
		rep, err = p.eng.Sync(ctx, prep.Applied)
	}
	rep.Full = rep.Full || full || prep.Full
	rep.LeftOut = joinLeftOut(prep.LeftOut, rep.LeftOut)
	return rep, errors.Join(perr, err)
}

// joinLeftOut joins the services the two halves left out: the packet
// path's errors first, as it left them out before the maps saw them.
func joinLeftOut(packets, sockets map[string]error) map[string]error {
	if len(sockets) == 0 {
		return packets
	}
	out := maps.Clone(sockets)
	maps.Copy(out, packets)
	return out
}

// Cleanup detaches the hooks, removes the pins and forgets what the maps
// hold, and cleans Options.Packets up; nothing else. A later Sync starts
// over.
func (p *Proxier) Cleanup(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.cleanup()
	if p.opts.Packets != nil {
		err = errors.Join(err, p.opts.Packets.Cleanup(ctx))
	}
	return err
}

func (p *Proxier) cleanup() error {
	if p.eng.Closed() {
		return servicelb.ErrClosed
	}
	if p.maps == nil {
		return ErrRenderOnly
	}
	p.eng.Forget()
	p.model, p.packetsLeftOut = nil, nil
	var errs []error
	for i, l := range p.links {
		if l == nil {
			continue
		}
		if p.opts.PinPath != "" {
			if err := l.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("unpin link %s: %w", hooks[i].name, err))
			}
		}
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", hooks[i].name, err))
		}
		p.links[i] = nil
	}
	if p.opts.PinPath != "" {
		errs = append(errs, p.maps.unpin(), removeEmpty(p.mapDir), removeEmpty(p.opts.PinPath))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ebpf: cleanup: %w", err)
	}
	p.log.Info("hooks detached, pins removed")
	return nil
}

// Render returns what the maps would hold for st, as text (see Dump),
// and after it the packet path's rendering when Options.Packets renders.
// Every map is listed; the hooks' own (the affinity pins and reverse
// translations) are empty, as they are until sockets connect. It needs
// no privileges and touches no kernel state.
func (p *Proxier) Render(st *servicelb.State) (string, error) {
	if err := st.Check(); err != nil {
		return "", err
	}
	node := st.Node()
	if err := p.caps.CheckNode(&node); err != nil {
		return "", err
	}
	m, err := buildModel(st, &p.caps, nil, p.opts.Packets != nil)
	if err != nil {
		return "", err
	}
	text := formatContent(m.content(0), &hookContent{sizes: p.opts.Sizes}, m.annotations())
	if r, ok := p.opts.Packets.(servicelb.Renderer); ok {
		more, err := r.Render(st)
		if err != nil {
			return "", err
		}
		text += "\n" + more
	}
	return text, nil
}

// Dump reads the maps and lists what they hold, as Render does, with
// what the hooks wrote: each ClientIP affinity pin (by client network
// namespace and set, with the set's name and how long it has been idle)
// and each socket's reverse translation (with the service port whose
// address it shows, when this Proxier has synced).
func (p *Proxier) Dump(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.eng.Closed() {
		return "", servicelb.ErrClosed
	}
	if p.maps == nil {
		return "", ErrRenderOnly
	}
	c, err := p.maps.read()
	if err != nil {
		return "", fmt.Errorf("ebpf: dump: %w", err)
	}
	h, err := p.maps.readHooks(p.opts.Sizes)
	if err != nil {
		return "", fmt.Errorf("ebpf: dump: %w", err)
	}
	var notes map[feKey]string
	if p.model != nil {
		notes = p.model.annotations()
	}
	return formatContent(c, h, notes), nil
}
