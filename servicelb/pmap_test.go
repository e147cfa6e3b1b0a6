package servicelb

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pmapContents returns what m holds, checking each key with get too.
func pmapContents(t *testing.T, m *pmap[int, int]) map[int]int {
	t.Helper()
	out := map[int]int{}
	m.each(func(k, v int) {
		_, dup := out[k]
		require.False(t, dup, "key %d twice", k)
		out[k] = v
		got, ok := m.get(k)
		require.True(t, ok && got == v, "get(%d) = %d, %v; each gave %d", k, got, ok, v)
	})
	require.Len(t, out, m.n)
	return out
}

// A pmap holds what a Go map given the same changes holds, whatever its
// writer shares: every snapshot keeps what it held when taken, and diff
// of any two snapshots finds what a comparison of their contents finds.
// With hashes cut to a few bits, keys share whole hashes, and the lists
// past the last level are exercised as well.
func TestPmapAgainstAMap(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 0x3f, 0x3 << 58} {
		t.Run(fmt.Sprintf("mask-%x", mask), func(t *testing.T) {
			defer func(m uint64) { pmapHashMask = m }(pmapHashMask)
			pmapHashMask = mask
			r := rand.New(rand.NewPCG(uint64(mask), 3))
			var m pmap[int, int]
			o := &owner{}
			want := map[int]int{}
			type snap struct {
				m    pmap[int, int]
				want map[int]int
			}
			var snaps []snap
			for step := range 4000 {
				k := r.IntN(600)
				if r.IntN(3) == 0 {
					m.delete(o, k)
					delete(want, k)
				} else {
					m.set(o, k, step)
					want[k] = step
				}
				if r.IntN(50) == 0 {
					snaps = append(snaps, snap{m, maps.Clone(want)})
					o = &owner{} // shared: later writes copy
				}
				if r.IntN(200) == 0 {
					require.Equal(t, want, pmapContents(t, &m), "step %d", step)
				}
			}
			require.Equal(t, want, pmapContents(t, &m))
			snaps = append(snaps, snap{m, want})
			for _, s := range snaps {
				require.Equal(t, s.want, pmapContents(t, &s.m), "a snapshot changed")
			}
			for range 100 {
				a, b := snaps[r.IntN(len(snaps))], snaps[r.IntN(len(snaps))]
				var got []int
				a.m.diff(&b.m, func(x, y int) bool { return x == y }, func(k, va, vb int, inA, inB bool) {
					_, wantA := a.want[k]
					_, wantB := b.want[k]
					require.Equal(t, wantA, inA)
					require.Equal(t, wantB, inB)
					if inA {
						require.Equal(t, a.want[k], va)
					}
					if inB {
						require.Equal(t, b.want[k], vb)
					}
					got = append(got, k)
				})
				var wantKeys []int
				for k := range a.want {
					if v, ok := b.want[k]; !ok || v != a.want[k] {
						wantKeys = append(wantKeys, k)
					}
				}
				for k := range b.want {
					if _, ok := a.want[k]; !ok {
						wantKeys = append(wantKeys, k)
					}
				}
				slices.Sort(got)
				slices.Sort(wantKeys)
				require.Equal(t, wantKeys, got)
			}
			// Deleting everything leaves the empty map.
			for k := range want {
				m.delete(o, k)
			}
			require.Nil(t, m.root)
			require.Zero(t, m.n)
		})
	}
}

// TestPmapNodesHoldNoSpareRoom: a node's array is as long as its slots,
// filled in place by one writer or copied along a path: every State that
// shares a node keeps its array as long as the node lives.
func TestPmapNodesHoldNoSpareRoom(t *testing.T) {
	var m pmap[int, int]
	o := &owner{}
	for k := range 20000 {
		m.set(o, k, k)
		if k%1000 == 0 {
			o = &owner{}
		}
	}
	var walk func(n *pnode[int, int])
	spare := 0
	walk = func(n *pnode[int, int]) {
		spare += cap(n.slots) - len(n.slots)
		for _, s := range n.slots {
			if s.child != nil {
				walk(s.child)
			}
		}
	}
	walk(m.root)
	assert.Zero(t, spare, "slots allocated and unused")
}
