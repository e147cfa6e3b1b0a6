//go:build soak

package soak

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/kproxy-dev/kproxy/internal/netnstest"
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
	px *proxier
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

// serviceName is the name of service i.
func serviceName(i int) string { return fmt.Sprintf("soak/svc-%04d", i) }

// clusterIP is the cluster IP of service i: the i+1-th address of the
// service CIDR.
func clusterIP(i int) netip.Addr {
	b := serviceCIDR.Addr().As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+uint32(i)+1)
	return netip.AddrFrom4(b)
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
func (w *world) attach(px *proxier) error {
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
func (w *world) detach(px *proxier) *proxier {
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
func (w *world) running() *proxier {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.px
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
