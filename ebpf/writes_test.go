//go:build linux

package ebpf

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/testkit/servicetest"
	"github.com/kproxy-dev/kproxy/servicelb"
)

// countingMap stands for a BPF map: it counts the syscalls a write makes
// (each call of *ebpf.Map's is one) and the entries they carry.
type countingMap struct {
	name    string
	calls   []string
	entries int
}

func (m *countingMap) Put(_, _ any) error { m.calls = append(m.calls, "put"); m.entries++; return nil }
func (m *countingMap) Delete(any) error   { m.calls = append(m.calls, "delete"); m.entries++; return nil }
func (m *countingMap) BatchUpdate(keys, _ any, _ *ebpf.BatchOptions) (int, error) {
	n := reflect.ValueOf(keys).Len()
	m.calls = append(m.calls, fmt.Sprintf("batch update %d", n))
	m.entries += n
	return n, nil
}
func (m *countingMap) BatchDelete(keys any, _ *ebpf.BatchOptions) (int, error) {
	n := reflect.ValueOf(keys).Len()
	m.calls = append(m.calls, fmt.Sprintf("batch delete %d", n))
	m.entries += n
	return n, nil
}
func (m *countingMap) String() string { return m.name }

// counting returns writers of counting maps, and the maps by name.
func counting() (*writers, map[string]*countingMap) {
	ms := map[string]*countingMap{}
	for _, n := range []string{mapFrontends, mapSets, mapSlots, mapMembers, mapNames, mapConfig} {
		ms[n] = &countingMap{name: n}
	}
	return &writers{fe: ms[mapFrontends], sets: ms[mapSets], slots: ms[mapSlots], members: ms[mapMembers],
		names: ms[mapNames], cfg: ms[mapConfig]}, ms
}

// syscalls returns the calls each map took, leaving out those that took
// none.
func syscalls(ms map[string]*countingMap) map[string][]string {
	out := map[string][]string{}
	for n, m := range ms {
		if len(m.calls) > 0 {
			out[n] = m.calls
		}
	}
	return out
}

// TestOneEndpointCostsAFewWrites: an endpoint added to, removed from or
// replaced in a service of ten costs the map writes the package
// documentation gives, whatever else the maps hold: its slot, the set's
// count, the slot freed at the end; with ClientIP affinity, its
// membership too.
func TestOneEndpointCostsAFewWrites(t *testing.T) {
	caps := capabilities(packetPath{})
	ep := func(i int) servicelb.Endpoint {
		return servicelb.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 99, 0, byte(i)}), NodeName: "node-9"}
	}
	eps := func(is ...int) []servicelb.Endpoint {
		var out []servicelb.Endpoint
		for _, i := range is {
			out = append(out, ep(i))
		}
		return out
	}
	ten := eps(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	for _, tc := range []struct {
		name     string
		after    []servicelb.Endpoint
		writes   int
		affinity int // with ClientIP affinity
	}{
		{"added", eps(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11), 2, 3},
		{"the last removed", eps(1, 2, 3, 4, 5, 6, 7, 8, 9), 2, 3},
		{"another removed", eps(1, 2, 3, 5, 6, 7, 8, 9, 10), 3, 4},
		{"replaced", eps(1, 2, 3, 11, 5, 6, 7, 8, 9, 10), 1, 3},
	} {
		for _, sticky := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s affinity=%v", tc.name, sticky), func(t *testing.T) {
				svcs := servicetest.Scale(1000, 10)
				svc := func(list []servicelb.Endpoint) servicelb.Service {
					s := svcs[500]
					s.Endpoints = list
					if sticky {
						s.Affinity = servicelb.SessionAffinity{ClientIP: true, Timeout: time.Minute}
					}
					return s
				}
				svcs[500] = svc(ten)
				before, err := servicelb.NewState(servicetest.ScaleNode(), svcs...)
				require.NoError(t, err)
				svcs[500] = svc(tc.after)
				after, err := servicelb.NewState(servicetest.ScaleNode(), svcs...)
				require.NoError(t, err)

				m, err := buildModel(before, &caps, nil, true)
				require.NoError(t, err)
				ch := servicelb.Diff(before, after)
				s, err := m.plan(after, &ch, &caps)
				require.NoError(t, err)
				w, ms := counting()
				require.NoError(t, s.d.run(w, nil))
				want := tc.writes
				if sticky {
					want = tc.affinity
				}
				n := 0
				for _, calls := range syscalls(ms) {
					for _, c := range calls {
						assert.Contains(t, []string{"put", "delete"}, c, "one entry, one plain write")
						n++
					}
				}
				assert.Equal(t, want, n, "map writes: %v", syscalls(ms))
				assert.LessOrEqual(t, n, 4)
			})
		}
	}
}

// TestColdSyncWritesInBatches: a cold sync writes each map's entries in
// batches of batchSize, one syscall each: a few dozen syscalls for 10k
// services of 10 endpoints, not one per entry.
func TestColdSyncWritesInBatches(t *testing.T) {
	caps := capabilities(packetPath{})
	st, err := servicelb.NewState(servicetest.ScaleNode(), servicetest.Scale(10000, 10)...)
	require.NoError(t, err)
	m, err := buildModel(st, &caps, nil, true)
	require.NoError(t, err)
	empty := newContent()
	d := diffContent(empty, m.content(7))
	w, ms := counting()
	require.NoError(t, d.run(w, nil))
	assert.Equal(t, map[string][]string{
		mapFrontends: {"batch update 4096", "batch update 4096", "batch update 1808"},
		mapSets:      {"batch update 4096", "batch update 4096", "batch update 1808"},
		mapNames:     {"batch update 4096", "batch update 4096", "batch update 1808"},
		mapSlots: {"batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096",
			"batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096",
			"batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096",
			"batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096",
			"batch update 4096", "batch update 4096", "batch update 4096", "batch update 4096", "batch update 1696"},
		mapConfig: {"put"},
	}, syscalls(ms))
	assert.Equal(t, 100000, ms[mapSlots].entries)

	// Removing them all deletes in batches too.
	d = diffContent(m.content(7), empty)
	w, ms = counting()
	require.NoError(t, d.run(w, nil))
	for _, n := range []string{mapFrontends, mapSets, mapNames, mapSlots} {
		for _, c := range ms[n].calls {
			assert.Regexp(t, `^batch delete \d+$`, c, n)
		}
	}
	assert.Equal(t, 100000, ms[mapSlots].entries)
	assert.Len(t, ms[mapSlots].calls, 25)
}
