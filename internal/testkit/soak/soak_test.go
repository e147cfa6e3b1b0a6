//go:build soak

package soak

import (
	"context"
	"flag"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

var (
	flagBackend   = flag.String("soak.backend", "nftables", "the backend under test: nftables or iptables")
	flagDuration  = flag.Duration("soak.duration", 10*time.Minute, "how long changes, traffic and faults run")
	flagServices  = flag.Int("soak.services", 2000, "number of services")
	flagEndpoints = flag.Int("soak.endpoints", 10, "endpoints per service, out of the backend hosts")
	flagRate      = flag.Float64("soak.rate", 100, "endpoint changes per second")
	flagFaults    = flag.Duration("soak.fault-every", 12500*time.Millisecond, "mean time between faults (each wait is 0.4 to 1.6 times it)")
	flagAskers    = flag.Int("soak.askers", 4, "goroutines opening fresh connections")
	flagAskRate   = flag.Float64("soak.ask-rate", 100, "fresh connections per second, all askers together")
	flagSessions  = flag.Int("soak.sessions", 50, "long-lived sessions")
	flagSeed      = flag.Uint64("soak.seed", 0, "random seed; 0 picks one, which the report prints")
	flagVerify    = flag.Duration("soak.verify-interval", 0, "the backend's Options.VerifyInterval; 0 means its default")
	flagRestarts  = flag.Duration("soak.restart-every", time.Minute, "the least time between two restarts of the proxier")
	flagMaxRSS    = flag.Float64("soak.max-rss-growth", 64, "the most the proxier's resident set size may grow, in MiB an hour (judged over 5 minutes of samples or more)")
	flagMaxGo     = flag.Float64("soak.max-goroutine-growth", 60, "the most the proxier's goroutines may grow, an hour (judged over 5 minutes of samples or more)")
)

// TestMain runs the proxier process when the test binary is run again as
// one (see proxier_test.go), and the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runProxier())
	}
	os.Exit(m.Run())
}

// TestSoak runs the soak for -soak.duration; see the package
// documentation.
func TestSoak(t *testing.T) {
	dp, err := dataplaneFor(*flagBackend)
	require.NoError(t, err)
	netnstest.Require(t, dp.features()...)
	require.GreaterOrEqual(t, backendHosts, *flagEndpoints+1, "-soak.endpoints leaves no backend host to change to")
	require.Positive(t, *flagServices)
	require.LessOrEqual(t, *flagServices, 1<<16, "-soak.services: cluster IPs run out")

	s := newSoak(t, dp)
	s.run(*flagDuration)
	s.finish()
}

// soak is one run.
type soak struct {
	t     *testing.T
	dp    dataplane
	tp    *netnstest.Topology
	node  servicelb.NodeConfig
	seed  uint64
	start time.Time
	// nsFile is the node's namespace, inherited by every proxier process.
	nsFile *os.File

	world *world
	led   *ledger
	procs *supervisor

	// Each activity runs until its context ends; its goroutines are
	// counted by its group.
	stopChanges, stopFaults, stopTraffic context.CancelFunc
	changes, faults, traffic, watches    sync.WaitGroup
	// watchCtx bounds the probes of fault repairs.
	watchCtx    context.Context
	stopWatches context.CancelFunc

	// rngMu guards rng, which the fault loop and the test draw from.
	rngMu sync.Mutex
	rng   *rand.Rand
}

func newSoak(t *testing.T, dp dataplane) *soak {
	seed := *flagSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	s := &soak{t: t, dp: dp, seed: seed, rng: rand.New(rand.NewPCG(seed, 1))}
	t.Logf("soak: backend %s, %d services x %d endpoints, %.0f changes/s, seed %d", dp.name(), *flagServices, *flagEndpoints, *flagRate, seed)
	s.tp = netnstest.New(t, netnstest.Options{Backends: backendHosts})
	for _, b := range s.tp.Backends {
		b.Serve(t, "tcp", httpTarget)
		serveLines(t, b, lineTarget)
	}
	s.node = servicelb.NodeConfig{
		NodeName:     nodeName,
		NodeIPs:      s.tp.NodeIPs(),
		ClusterCIDRs: netnstest.ClusterCIDRs(),
		ServiceCIDRs: []netip.Prefix{serviceCIDR},
	}
	f, err := os.Open(filepath.Join(netnstest.RunDir, s.tp.Node.NSName))
	require.NoError(t, err, "open the node's namespace")
	t.Cleanup(func() { f.Close() })
	s.nsFile = f
	s.world = newWorld(rand.New(rand.NewPCG(seed, 2)), *flagServices, *flagEndpoints)
	s.led = newLedger()
	s.procs = &supervisor{s: s}
	s.watchCtx, s.stopWatches = context.WithCancel(context.Background())
	t.Cleanup(s.stopWatches)
	return s
}

// run loads the services into a first proxier, then runs changes,
// traffic and faults for d.
func (s *soak) run(d time.Duration) {
	t := s.t
	loaded := time.Now()
	require.NoError(t, s.procs.start(), "start the proxier")
	require.NoError(t, s.procs.settle(5*time.Minute), "the first proxier never synced the initial state")
	t.Logf("soak: initial state of %d services applied in %v", *flagServices, time.Since(loaded).Round(time.Millisecond))

	s.start = time.Now()
	s.led.begin(s.start)
	var ctx context.Context
	ctx, s.stopTraffic = context.WithCancel(context.Background())
	s.startTraffic(ctx)
	ctx, s.stopChanges = context.WithCancel(context.Background())
	s.changes.Go(func() { s.changeLoop(ctx) })
	ctx, s.stopFaults = context.WithCancel(context.Background())
	s.faults.Go(func() { s.faultLoop(ctx) })
	t.Cleanup(func() {
		// On an early exit: stop everything the run started.
		s.stopFaults()
		s.stopChanges()
		s.stopTraffic()
		s.faults.Wait()
		s.changes.Wait()
		s.traffic.Wait()
	})

	s.progress(d)
}

// progress waits for d, logging a line of figures every 30 s.
func (s *soak) progress(d time.Duration) {
	end := time.After(d)
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-end:
			return
		case <-tick.C:
			s.t.Logf("soak: %s", s.led.progress(time.Now(), s.world.changeCount()))
		}
	}
}

// finish stops faults and changes, waits for the proxier to apply the
// final state, stops traffic, compares the kernel with a fresh apply and
// reports.
func (s *soak) finish() {
	t := s.t
	s.stopFaults()
	s.faults.Wait()
	s.stopChanges()
	s.changes.Wait()
	end := time.Now()
	t.Logf("soak: faults and changes stopped after %v; waiting for the repairs and the final sync", end.Sub(s.start).Round(time.Second))
	s.watches.Wait()
	if err := s.procs.settle(5 * time.Minute); err != nil {
		t.Errorf("soak: %v", err)
	}
	time.Sleep(settleTime)
	s.stopTraffic()
	s.traffic.Wait()

	equal := s.compareFinal()
	s.procs.stop()
	rep := s.led.report(reportInput{
		backend: s.dp.name(), seed: s.seed, duration: end.Sub(s.start),
		services: *flagServices, endpoints: *flagEndpoints, changes: s.world.changeCount(),
		kinds: s.faultKinds(), equal: equal,
		limits: growthLimits{rssMiB: *flagMaxRSS, goroutines: *flagMaxGo},
	})
	t.Log("soak report:\n" + rep.text)
	for _, e := range rep.errors {
		t.Error(e)
	}
}

// random returns a number in [0, n) from the soak's generator.
func (s *soak) random(n int) int {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.IntN(n)
}

// between returns a duration drawn uniformly from [lo, hi].
func (s *soak) between(lo, hi time.Duration) time.Duration {
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// changeLoop makes -soak.rate changes a second until ctx ends, catching
// up after a slow moment rather than dropping changes.
func (s *soak) changeLoop(ctx context.Context) {
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	made := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * *flagRate)
		for ; made < due && ctx.Err() == nil; made++ {
			s.world.change()
		}
	}
}
