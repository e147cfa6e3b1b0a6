package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/servicelb"
	"github.com/kproxy-dev/kproxy/userspace"
)

// Renderer shows states as a dataplane's own tools would, and says what
// the dataplane can express: what a dry run needs.
type Renderer interface {
	servicelb.Renderer
	Capabilities() servicelb.Capabilities
}

// Dataplane is a backend as an agent drives it: it applies states and can
// show them as the dataplane's own tools would.
type Dataplane interface {
	servicelb.Proxier
	servicelb.Renderer
}

// BackendOptions are what every backend is built with.
type BackendOptions struct {
	// NetNS is the namespace to program; netns.None() means the caller's.
	NetNS netns.NsHandle
	// Node is the node the states are compiled for.
	Node   servicelb.NodeConfig
	Logger *slog.Logger
	// UserspaceHandover is the userspace backend's handover socket
	// (UserspaceFlags.HandoverSocket); empty for none.
	UserspaceHandover string
	// StrictARP is the ipvs backend's ipvs.Options.StrictARP and the
	// userspace backend's userspace.Options.StrictARP (when it holds
	// addresses); the others hold no address and ignore it.
	StrictARP bool
	// ConntrackTCPLiberal is the iptables backend's
	// iptables.Options.ConntrackTCPLiberal (Config.Conntrack.TCPBeLiberal);
	// other backends ignore it.
	ConntrackTCPLiberal bool
	// Cgroup and PinPath are the ebpf backend's (Config.Cgroup,
	// Config.BPFPinPath).
	Cgroup, PinPath string
	// Userspace are the userspace backend's options (Config.Userspace);
	// nil holds the services' addresses, with the package's defaults.
	// NetNS and Logger are set from the fields above.
	Userspace *userspace.Options
}

// ErrNoBackend: the backend is named right but this build has no
// implementation of it.
var ErrNoBackend = errors.New("backend not available in this build of kproxy")

// ErrUnsupported: the kernel lacks what the backend needs. It is
// servicelb.ErrNotSupported, which every backend's Probe and New wrap (in
// a *servicelb.FeatureError naming what is missing).
var ErrUnsupported = servicelb.ErrNotSupported

// ErrOptions: the backend needs a flag that is not set.
var ErrOptions = errors.New("backend option missing")

// ErrNothingOwned: nothing of the backend can be there, so there is
// nothing to clean up.
var ErrNothingOwned = errors.New("nothing of the backend can be there")

type backend struct {
	// probe checks, changing nothing, what the backend needs (its
	// package's Probe), with a message naming what is missing.
	probe func(BackendOptions) error
	// open returns the backend; nil while this build has none.
	open func(BackendOptions) (Dataplane, error)
	// render returns a renderer that needs no kernel support and opens
	// no socket, for dry runs; nil means open's backend renders.
	render func(BackendOptions) (Renderer, error)
	// cleanup removes what the backend owns without opening it, for a
	// backend that cannot be opened with what a cleanup knows (ebpf needs
	// its cgroup); nil means open it and call its Cleanup.
	cleanup func(context.Context, BackendOptions) error
	// uses names the backends whose objects this one holds as its own
	// (ebpf's packet path is the nftables backend's table): they are not
	// cleaned up while this one runs. A backend that uses another's
	// objects has a cleanup that leaves them.
	uses []string
	// absent returns why the kernel cannot hold objects of the backend,
	// found without loading anything; nil when it can. A cleanup of an
	// absent backend touches nothing: its probe would have the kernel
	// load the module (asking for the IPVS netlink family loads ip_vs).
	// nil means always present.
	absent func() error
}

// backends maps each --backend value to its implementation.
var backends = map[string]backend{
	"nftables": {probe: probeNFTables, open: openNFTables, render: renderNFTables},
	"iptables": {probe: probeIPTables, open: openIPTables, render: renderIPTables},
	"ipvs":     {probe: probeIPVS, open: openIPVS, render: renderIPVS, absent: notLoaded("ip_vs")},
	"ebpf": {probe: probeEBPF, open: openEBPF, render: renderEBPF,
		cleanup: cleanupEBPF, uses: []string{"nftables"}},
	"userspace": {probe: probeUserspace, open: openUserspace, render: renderUserspace, cleanup: cleanupUserspace},
}

// BackendNames returns the accepted --backend values.
func BackendNames() []string {
	var out []string
	for n := range backends {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func lookup(name string) (backend, error) {
	b, ok := backends[name]
	if !ok {
		return b, fmt.Errorf("--backend %q: want one of %s", name, strings.Join(BackendNames(), ", "))
	}
	return b, nil
}

func (b backend) available(name string) error {
	if b.open == nil {
		return fmt.Errorf("%s: %w", name, ErrNoBackend)
	}
	return nil
}

// Available returns an error unless this build has the named backend. It
// touches nothing.
func Available(name string) error {
	b, err := lookup(name)
	if err != nil {
		return err
	}
	return b.available(name)
}

// Open probes the kernel for the named backend's support and returns the
// backend. The error names what is missing.
//
// Every error about a backend starts with its name, once: a backend
// package's own errors do (its New, Cleanup and Sync), so the agent adds
// nothing to them; the agent's own (the probes, missing flags) name the
// backend themselves.
func Open(name string, o BackendOptions) (Dataplane, error) {
	b, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if err := b.probe(o); err != nil {
		return nil, err
	}
	if err := b.available(name); err != nil {
		return nil, err
	}
	return b.open(o)
}

// Renderer returns the named backend for rendering only: a dry run. It
// probes nothing and installs nothing.
func OpenRenderer(name string, o BackendOptions) (Renderer, error) {
	b, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if err := b.available(name); err != nil {
		return nil, err
	}
	if b.render != nil {
		return b.render(o)
	}
	return b.open(o)
}

// Cleanup removes everything the named backend owns in the namespace
// o.NetNS (its own Cleanup), then releases it. It returns an error
// wrapping ErrUnsupported, ErrNoBackend or ErrNothingOwned, and touches
// nothing, when the kernel lacks the backend's support, this build lacks
// the backend, or nothing of it can be left.
func Cleanup(ctx context.Context, name string, o BackendOptions) error {
	b, err := lookup(name)
	if err != nil {
		return err
	}
	if b.absent != nil {
		if why := b.absent(); why != nil {
			return fmt.Errorf("%s: cleanup: %w: %v", name, ErrNothingOwned, why)
		}
	}
	if b.cleanup != nil {
		if err := b.available(name); err != nil {
			return err
		}
		return b.cleanup(ctx, o)
	}
	d, err := Open(name, o)
	if err != nil {
		return err
	}
	err = d.Cleanup(ctx)
	if cerr := d.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("%s: close after cleanup: %w", name, cerr))
	}
	return err
}

// CleanupAll removes what every backend of this build owns in the
// namespace o.NetNS, as kube-proxy's --cleanup does: a backend whose
// kernel support is missing owns nothing there and is skipped, with a
// note in the log, as is one of which nothing outlives its process. It
// returns the errors of the others, joined.
func CleanupAll(ctx context.Context, o BackendOptions) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	for _, name := range BackendNames() {
		err := Cleanup(ctx, name, o)
		switch {
		case skipped(err):
			log.Info("cleanup: backend skipped", "backend", name, "reason", err)
		case err != nil:
			errs = append(errs, err)
		default:
			log.Info("cleanup: removed what the backend owns", "backend", name)
		}
	}
	return errors.Join(errs...)
}

// skipped reports whether a backend's Cleanup touched nothing because
// nothing of the backend can be there.
func skipped(err error) bool {
	return errors.Is(err, ErrUnsupported) || errors.Is(err, ErrNoBackend) || errors.Is(err, ErrNothingOwned)
}

// others returns the backends whose objects a running backend removes
// after its first sync: all but itself and those it uses.
func others(name string) []string {
	var out []string
	for _, n := range BackendNames() {
		if n != name && !slices.Contains(backends[name].uses, n) {
			out = append(out, n)
		}
	}
	return out
}

// notLoaded returns an error unless a kernel module is loaded or built
// in, as /sys/module shows it (a built-in module with parameters, as
// ip_vs has, is there too).
func notLoaded(module string) func() error {
	return func() error {
		if _, err := os.Stat("/sys/module/" + module); err != nil {
			return fmt.Errorf("the %s module is not loaded", module)
		}
		return nil
	}
}

// dryRun is a Proxier that prints what each sync would install.
type dryRun struct {
	r    Renderer
	name string
	w    io.Writer

	mu   sync.Mutex
	n    int
	last string
}

func (d *dryRun) Capabilities() servicelb.Capabilities { return d.r.Capabilities() }

func (d *dryRun) Sync(_ context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	text, err := d.r.Render(st)
	if err != nil {
		return servicelb.SyncReport{}, fmt.Errorf("render: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	rep := servicelb.SyncReport{Applied: st, Full: d.n == 1}
	if d.n > 1 && text == d.last {
		return rep, nil
	}
	d.last = text
	fmt.Fprintf(d.w, "# %s dry run, sync %d: %d services\n%s", d.name, d.n, st.Len(), text)
	if !strings.HasSuffix(text, "\n") {
		fmt.Fprintln(d.w)
	}
	return rep, nil
}

func (d *dryRun) Cleanup(context.Context) error { return nil }

// Close closes the renderer, when it holds anything.
func (d *dryRun) Close() error {
	if c, ok := d.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
