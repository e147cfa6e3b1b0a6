//go:build linux

package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/syncer"
	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// halves records, in one list, the states each half of a Proxier's Sync
// was given: "packets <n>" by the packet path, "maps <n>" by the Engine's
// backend standing for the maps, n the state's mark.
type halves struct {
	mu  sync.Mutex
	log []string
}

func (h *halves) add(half string, st *servicelb.State) {
	h.mu.Lock()
	h.log = append(h.log, half+" "+mark(st))
	h.mu.Unlock()
	time.Sleep(50 * time.Microsecond) // widen the window between the halves
}

// mark names the services of a state, sorted and joined by commas.
func mark(st *servicelb.State) string {
	var names []string
	for _, s := range st.Services() {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "empty"
	}
	return strings.Join(names, ",")
}

func markedState(t *testing.T, n int) *servicelb.State {
	st, err := servicelb.NewState(servicelb.NodeConfig{}, servicelb.Service{Name: fmt.Sprintf("d/s%d", n),
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports:      []servicelb.Port{{Name: "p", Protocol: servicelb.TCP, Port: 80}}})
	require.NoError(t, err)
	return st
}

// packetHalf is a packet path that records what it is given, leaves out
// the services of leaveOut and fails with fail.
type packetHalf struct {
	h        *halves
	leaveOut map[string]error
	fail     error
}

func (p packetHalf) Sync(_ context.Context, st *servicelb.State) (servicelb.SyncReport, error) {
	p.h.add("packets", st)
	if p.fail != nil {
		return servicelb.SyncReport{}, p.fail
	}
	var names []string
	for name := range p.leaveOut {
		names = append(names, name)
	}
	return servicelb.SyncReport{Applied: st.Without(names...), LeftOut: p.leaveOut}, nil
}
func (packetHalf) Cleanup(context.Context) error { return nil }
func (packetHalf) Close() error                  { return nil }
func (packetHalf) Capabilities() servicelb.Capabilities {
	return packetPath{}.Capabilities()
}

// mapHalf stands for the maps under the Proxier's Engine.
type mapHalf struct{ h *halves }

func (mapHalf) Check(context.Context) (bool, error)  { return true, nil }
func (mapHalf) Verify(context.Context) (bool, error) { return true, nil }
func (m mapHalf) Write(_ context.Context, st *servicelb.State) error {
	m.h.add("maps", st)
	return nil
}
func (m mapHalf) Apply(_ context.Context, st *servicelb.State, _ *servicelb.Changes) (bool, error) {
	m.h.add("maps", st)
	return false, nil
}

// TestConcurrentSyncsKeepTheHalvesTogether: Syncs called at once from
// several goroutines each give the maps and then the packet path their
// state, one Sync after the other: the halves of two Syncs never
// interleave, so both hold the state of the Sync that ran last. A Close
// among them is no data race (go test -race).
func TestConcurrentSyncsKeepTheHalvesTogether(t *testing.T) {
	h := &halves{}
	p, err := newProxier(Options{Cgroup: "/cg", Packets: &packetHalf{h: h}})
	require.NoError(t, err)
	p.eng = syncer.New(mapHalf{h}, syncer.Options{Name: "ebpf", Capabilities: p.caps})
	p.maps = &kmaps{} // stands for the maps: the backend above writes none

	const goroutines, each = 4, 25
	states := make([][]*servicelb.State, goroutines)
	for g := range states {
		for i := range each {
			states[g] = append(states[g], markedState(t, g*each+i))
		}
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for _, st := range states[g] {
				assert.NoError(t, servicetest.SyncErr(p.Sync(context.Background(), st)))
			}
		})
	}
	wg.Wait()
	require.Len(t, h.log, 2*goroutines*each)
	for i := 0; i < len(h.log); i += 2 {
		var a, b string
		fmt.Sscan(h.log[i], &a)
		fmt.Sscan(h.log[i+1], &b)
		require.Equal(t, "maps", a, "record %d: %v", i, h.log[i:i+2])
		require.Equal(t, "packets", b, "record %d: %v", i+1, h.log[i:i+2])
		require.Equal(t, h.log[i][len("maps "):], h.log[i+1][len("packets "):], "the halves of two Syncs interleave at %d: %v", i, h.log[i:i+2])
	}

	// Syncs racing with a Close: each either runs whole or finds the
	// Proxier closed.
	h.log = nil
	for g := range goroutines {
		wg.Go(func() {
			for _, st := range states[g] {
				if err := servicetest.SyncErr(p.Sync(context.Background(), st)); err != nil {
					assert.ErrorIs(t, err, servicelb.ErrClosed)
				}
			}
		})
	}
	time.Sleep(time.Millisecond)
	require.NoError(t, p.Close())
	wg.Wait()
}

// TestMapsHoldWhatThePacketPathApplied: the maps are given a state before
// the packet path, so that the hooks know every frontend the packet path
// serves; a service the packet path leaves out is taken out of the maps
// again, and not given to them first in later Syncs while the packet path
// leaves it out; the pair's report names it and reports the state both
// halves hold. A packet path that applies nothing has the maps go back to
// the state they held.
func TestMapsHoldWhatThePacketPathApplied(t *testing.T) {
	h := &halves{}
	refused := &servicelb.ValidationError{Service: "d/s1", Field: "ports", Err: servicelb.ErrRefused}
	half := &packetHalf{h: h, leaveOut: map[string]error{"d/s1": refused}}
	p, err := newProxier(Options{Cgroup: "/cg", Packets: half})
	require.NoError(t, err)
	p.eng = syncer.New(mapHalf{h}, syncer.Options{Name: "ebpf", Capabilities: p.caps})
	p.maps = &kmaps{}

	two := markedState(t, 0)
	b := two.Edit()
	s1 := *markedState(t, 1).Services()[0]
	s1.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.11")}
	require.NoError(t, b.Upsert(s1))
	two = b.State()

	rep, err := p.Sync(t.Context(), two)
	require.NoError(t, err)
	assert.Equal(t, []string{"maps d/s0,d/s1", "packets d/s0,d/s1", "maps d/s0"}, h.log,
		"the maps are given the state, then what the packet path applied")
	assert.Equal(t, map[string]error{"d/s1": refused}, rep.LeftOut)
	require.NotNil(t, rep.Applied)
	_, has := rep.Applied.Service("d/s1")
	assert.False(t, has, "the state applied holds the service left out")
	assert.Equal(t, 1, rep.Applied.Len())

	// Still left out: the maps are not given it, once.
	h.log = nil
	b = two.Edit()
	s2 := *markedState(t, 2).Services()[0]
	s2.ClusterIPs = []netip.Addr{netip.MustParseAddr("10.96.0.12")}
	require.NoError(t, b.Upsert(s2))
	three := b.State()
	rep, err = p.Sync(t.Context(), three)
	require.NoError(t, err)
	assert.Equal(t, []string{"maps d/s0,d/s2", "packets d/s0,d/s1,d/s2"}, h.log)
	assert.Equal(t, map[string]error{"d/s1": refused}, rep.LeftOut)

	h.log = nil
	boom := errors.New("boom")
	half.fail = boom
	rep, err = p.Sync(t.Context(), markedState(t, 3))
	require.ErrorIs(t, err, boom)
	assert.Nil(t, rep.Applied)
	assert.Equal(t, []string{"maps d/s3", "packets d/s3", "maps d/s0,d/s2"}, h.log,
		"the maps went back to what the pair held")
}
