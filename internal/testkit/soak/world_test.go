//go:build linux

package soak

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// world is the desired state: the services as the soak wants them, when
// each endpoint last left each service, and the proxier process they are
// fed to. Its methods are safe for concurrent use.
type world struct {
	mu      sync.Mutex
	rng     *rand.Rand
	svcs    []servicelb.Service
	removed map[removal]time.Time
	changes int
	// px is the running proxier, nil while none runs: changes made
	// meanwhile reach the next one with the whole state.
	px feed
}

// feed is what the world sends its services to: the running proxier
// process (a *proxier).
type feed interface {
	send(c command) error
}

// removal names an endpoint address of a service.
type removal struct {
	svc  int
	addr netip.Addr
}

// newWorld returns n services of k endpoints each, drawn at random from
// the backend hosts.
func newWorld(rng *rand.Rand, n, k int) *world {
	w := &world{rng: rng, removed: map[removal]time.Time{}}
	for i := range n {
		s := servicelb.Service{
			Name:       serviceName(i),
			ClusterIPs: []netip.Addr{clusterIP(i)},
			Ports: []servicelb.Port{
				{Name: "http", Protocol: servicelb.TCP, Port: httpPort, TargetPort: httpTarget},
				{Name: "line", Protocol: servicelb.TCP, Port: linePort, TargetPort: lineTarget},
			},
		}
		for _, b := range rng.Perm(backendHosts)[:k] {
			s.Endpoints = append(s.Endpoints, endpoint(b))
		}
		w.svcs = append(w.svcs, s)
	}
	return w
}

// endpoint is backend host b as an endpoint on the node.
func endpoint(b int) servicelb.Endpoint {
	return servicelb.Endpoint{Addr: netnstest.BackendIPv4(b), NodeName: nodeName}
}

// change replaces one endpoint of a random service by a backend host the
// service lacks, and sends the service to the running proxier.
func (w *world) change() {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := w.rng.IntN(len(w.svcs))
	s := &w.svcs[i]
	eps := slices.Clone(s.Endpoints)
	var free []int
	for b := range backendHosts {
		if !slices.ContainsFunc(eps, func(e servicelb.Endpoint) bool { return e.Addr == netnstest.BackendIPv4(b) }) {
			free = append(free, b)
		}
	}
	j := w.rng.IntN(len(eps))
	old := eps[j].Addr
	eps[j] = endpoint(free[w.rng.IntN(len(free))])
	s.Endpoints = eps
	w.removed[removal{i, old}] = time.Now()
	w.changes++
	if w.px != nil {
		// A proxier that died unexpectedly fails the soak through its
		// supervisor; its broken pipe needs no report here.
		_ = w.px.send(command{Op: opUpsert, Service: s})
	}
}

// removedWithin reports whether addr left service i at most d before at.
func (w *world) removedWithin(i int, addr netip.Addr, at time.Time, d time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.removed[removal{i, addr}]
	return ok && !r.After(at) && at.Sub(r) <= d
}

// changeCount returns the number of changes made.
func (w *world) changeCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changes
}

// services returns a copy of the desired services.
func (w *world) services() []servicelb.Service {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.svcs)
}

// attach makes px the running proxier: it sends px the whole state and
// then that its source has synced, with no change in between.
func (w *world) attach(px feed) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.svcs {
		if err := px.send(command{Op: opUpsert, Service: &w.svcs[i]}); err != nil {
			return err
		}
	}
	if err := px.send(command{Op: opSynced}); err != nil {
		return err
	}
	w.px = px
	return nil
}

// detach forgets the running proxier, if it is px (or any, for nil), and
// returns the one it forgot.
func (w *world) detach(px feed) feed {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.px
	if px != nil && cur != px {
		return nil
	}
	w.px = nil
	return cur
}

// running returns the running proxier, or nil.
func (w *world) running() feed {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.px
}

// backendAddr returns the IPv4 address of the backend host named name.
func backendAddr(name string) (netip.Addr, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "backend-"))
	if err != nil || !strings.HasPrefix(name, "backend-") || n < 0 || n >= backendHosts {
		return netip.Addr{}, false
	}
	return netnstest.BackendIPv4(n), true
}

func TestAddressing(t *testing.T) {
	assert.Equal(t, netip.MustParseAddr("172.16.0.1"), clusterIP(0))
	assert.Equal(t, netip.MustParseAddr("172.16.1.0"), clusterIP(255))
	assert.True(t, serviceCIDR.Contains(clusterIP(1<<16)))
	a, ok := backendAddr("backend-19")
	assert.True(t, ok)
	assert.Equal(t, netip.MustParseAddr("10.244.20.2"), a)
	_, ok = backendAddr("backend-20")
	assert.False(t, ok)
	_, ok = backendAddr("client")
	assert.False(t, ok)
	assert.Equal(t, "KPROXY-SVC-X", jumpTarget(`-A KPROXY-SERVICES -d 172.16.0.1/32 -m comment --comment "a b" -j KPROXY-SVC-X`))
}

// TestWorldChanges: a change replaces one endpoint by a backend host the
// service lacked, and remembers when the old one left.
func TestWorldChanges(t *testing.T) {
	w := newWorld(rand.New(rand.NewPCG(1, 2)), 50, 10)
	before := w.services()
	for range 200 {
		w.change()
	}
	after := w.services()
	assert.Equal(t, 200, w.changeCount())
	changed := 0
	for i := range after {
		seen := map[netip.Addr]bool{}
		for _, e := range after[i].Endpoints {
			require.False(t, seen[e.Addr], "service %d lists %s twice", i, e.Addr)
			seen[e.Addr] = true
		}
		require.Len(t, after[i].Endpoints, 10)
		for _, e := range before[i].Endpoints {
			if !seen[e.Addr] {
				changed++
				assert.True(t, w.removedWithin(i, e.Addr, time.Now(), time.Minute), "removal of %s from %d not recorded", e.Addr, i)
			}
		}
	}
	assert.Positive(t, changed)
}
