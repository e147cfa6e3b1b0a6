//go:build soak

package soak

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/iptables"
	"github.com/kproxy-dev/kproxy/nftables"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// Foreign writer: commits of another program to nf_tables in the node.
const (
	foreignEvery = 100 * time.Millisecond
	foreignFor   = 30 * time.Second
	foreignTable = "kpt-soak-foreign"
)

// probeEvery is how often the soak looks for a fault's repair.
const probeEvery = 250 * time.Millisecond

// backend is a Proxier the soak runs: nftables' or iptables'.
type backend interface {
	servicelb.Proxier
	Close() error
}

// newBackend returns the named backend's Proxier for the namespace ns.
func newBackend(name string, ns netns.NsHandle, verify time.Duration, log *slog.Logger) (backend, error) {
	switch name {
	case "nftables":
		p, err := nftables.New(nftables.Options{NetNS: ns, VerifyInterval: verify, Logger: log})
		if err != nil {
			return nil, err
		}
		return p, nil
	case "iptables":
		p, err := iptables.New(iptables.Options{NetNS: ns, VerifyInterval: verify, Logger: log})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	return nil, fmt.Errorf("unknown backend %q (want nftables or iptables)", name)
}

// dataplane is what the soak knows of a backend's kernel objects: which
// faults it can make there, how to make them and see them repaired, and
// how to read its state canonically.
type dataplane interface {
	name() string
	// features are the netnstest features the backend needs.
	features() []string
	// kernelFaults are the destructive faults the soak makes for it.
	kernelFaults() []faultKind
	// inject makes a fault in the node h, svc being a random service, and
	// returns what it did and a probe that reports its repair.
	inject(ctx context.Context, h *netnstest.Host, kind faultKind, svc servicelb.Service, random func(int) int) (injected, error)
	// canonical reads the backend's state in h in a form that two equal
	// states share whatever their history.
	canonical(ctx context.Context, h *netnstest.Host) (string, error)
}

// injected is a fault made.
type injected struct {
	detail string
	// repaired reports whether the kernel holds again what the fault
	// took away.
	repaired func(ctx context.Context) bool
}

// dataplaneFor returns the dataplane of the named backend.
func dataplaneFor(name string) (dataplane, error) {
	switch name {
	case "nftables":
		return nftDataplane{}, nil
	case "iptables":
		return iptDataplane{}, nil
	}
	return nil, fmt.Errorf("-soak.backend %q: want nftables or iptables", name)
}

// faultKinds lists every kind of fault the soak makes for its backend.
func (s *soak) faultKinds() []faultKind {
	return append(slices.Clone(s.dp.kernelFaults()), faultForeignWriter, faultRestart)
}

// faultLoop makes a fault at a random moment every 0.4 to 1.6 times
// -soak.fault-every until ctx ends; the foreign writer it starts ends
// with ctx too. The kinds come from a shuffled deck, so that even a short
// run meets each: a restart less than -soak.restart-every after the
// last, or a foreign writer while one writes, stays in the deck for a
// later turn.
func (s *soak) faultLoop(ctx context.Context) {
	mean := *flagFaults
	var deck []faultKind
	var lastRestart time.Time
	writing := false
	writerDone := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.between(mean*2/5, mean*8/5)):
		}
		select {
		case <-writerDone:
			writing = false
		default:
		}
		if len(deck) == 0 {
			deck = s.faultKinds()
			s.rngMu.Lock()
			s.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
			s.rngMu.Unlock()
		}
		i := slices.IndexFunc(deck, func(k faultKind) bool {
			return !(k == faultRestart && time.Since(lastRestart) < *flagRestarts || k == faultForeignWriter && writing)
		})
		if i < 0 {
			continue
		}
		kind := deck[i]
		deck = slices.Delete(deck, i, i+1)
		switch kind {
		case faultRestart:
			lastRestart = time.Now()
			s.led.note(faultRestart, lastRestart, "proxier killed")
			if err := s.procs.restart(s.between(time.Second, 3*time.Second)); err != nil {
				s.led.errorf("restart: %v", err)
			}
		case faultForeignWriter:
			writing = true
			s.led.note(faultForeignWriter, time.Now(), fmt.Sprintf("commits every %v for %v", foreignEvery, foreignFor))
			s.t.Logf("soak: fault %s at %s: commits every %v for %v", kind, s.led.since(time.Now()), foreignEvery, foreignFor)
			s.faults.Go(func() {
				defer func() { writerDone <- struct{}{} }()
				s.foreignWriter(ctx)
			})
		default:
			s.kernelFault(ctx, kind)
		}
	}
}

// kernelFault makes a destructive fault and watches for its repair. The
// end of ctx does not cut the fault's commands short: a tool killed after
// it committed would leave a fault without a window.
func (s *soak) kernelFault(ctx context.Context, kind faultKind) {
	svc := s.world.services()[s.random(*flagServices)]
	at := time.Now()
	inj, err := s.dp.inject(context.WithoutCancel(ctx), s.tp.Node, kind, svc, s.random)
	if err != nil {
		s.t.Logf("soak: fault %s not made: %v", kind, err)
		return
	}
	f := s.led.opened(kind, at, inj.detail)
	s.t.Logf("soak: fault %s at %s: %s", kind, s.led.since(at), inj.detail)
	s.watches.Go(func() { s.watch(f, inj.repaired) })
}

// watch probes for the repair of f until it is seen or repairTimeout
// passes.
func (s *soak) watch(f *fault, repaired func(context.Context) bool) {
	ctx, cancel := context.WithTimeout(s.watchCtx, repairTimeout)
	defer cancel()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		if repaired(ctx) {
			s.led.repaired(f, time.Now())
			return
		}
		select {
		case <-ctx.Done():
			s.led.unrepaired(f, time.Now())
			s.t.Logf("soak: fault %s at %s not repaired within %v", f.kind, s.led.since(f.at), repairTimeout)
			return
		case <-tick.C:
		}
	}
}

// foreignWriter commits to a table of its own in the node every
// foreignEvery for foreignFor (or until ctx ends), as a firewall manager
// would: each commit moves the ruleset's generation under the proxier.
func (s *soak) foreignWriter(ctx context.Context) {
	h := s.tp.Node
	bg := context.Background()
	if _, err := h.Output(bg, "", "nft", "add", "table", "inet", foreignTable); err != nil {
		s.led.errorf("foreign writer: %v", err)
		return
	}
	defer func() {
		if _, err := h.Output(bg, "", "nft", "delete", "table", "inet", foreignTable); err != nil {
			s.led.errorf("foreign writer: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, foreignFor)
	defer cancel()
	tick := time.NewTicker(foreignEvery)
	defer tick.Stop()
	commits, verb := 0, "add"
	for {
		select {
		case <-ctx.Done():
			s.t.Logf("soak: foreign writer done: %d commits", commits)
			return
		case <-tick.C:
		}
		if _, err := h.Output(bg, "", "nft", verb, "chain", "inet", foreignTable, "c"); err == nil {
			commits++
		}
		verb = map[string]string{"add": "delete", "delete": "add"}[verb]
	}
}
