//go:build linux

package ipvs

import (
	"math/bits"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/servicelb"
)

func unit(svc string, f servicelb.Family) markUnit {
	return markUnit{key: servicelb.ServicePortKey{Service: svc, Port: "p", Family: f}, action: servicelb.ToCluster}
}

// TestMarkSpace checks that the marks of a mask are made of its bits
// only, distinct, and all of them, also for a mask in pieces.
func TestMarkSpace(t *testing.T) {
	for _, mask := range []uint32{0x0fff0000, 0x00030000, 0x80010100} {
		s := markSpace{mask}
		require.Equal(t, uint64(1)<<bits.OnesCount32(mask)-1, s.slots())
		seen := map[uint32]bool{}
		for n := uint64(1); n <= min(s.slots(), 5000); n++ {
			m := s.mark(n)
			require.NotZero(t, m)
			require.Zero(t, m&^mask, "mark %#x of slot %d has bits outside %#x", m, n, mask)
			require.False(t, seen[m], "mark %#x twice", m)
			seen[m] = true
			require.True(t, s.owns(m|0x4000))
		}
	}
	require.Equal(t, uint32(0x80010000), markSpace{0x80010100}.mark(6))
	require.False(t, markSpace{DefaultFWMarkMask}.owns(0x4000))
}

// TestMarksDeterministic checks that the marks of a set of units do not
// depend on the order the units come in (a restarted proxier gives the
// same ones), are distinct within a family and may repeat across
// families, and that a unit keeps its mark when others that do not
// collide with it come and go.
func TestMarksDeterministic(t *testing.T) {
	s := markSpace{0x000f0000}
	var units []markUnit
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		units = append(units, unit(name, servicelb.IPv4), unit(name, servicelb.IPv6))
	}
	want, err := s.allocate(units)
	require.NoError(t, err)
	for i := range 20 {
		shuffled := slices.Clone(units)
		slices.Reverse(shuffled)
		shuffled = append(shuffled[i%len(shuffled):], shuffled[:i%len(shuffled)]...)
		got, err := s.allocate(shuffled)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	for _, f := range families() {
		seen := map[uint32]markUnit{}
		for u, m := range want {
			if u.key.Family == f {
				require.NotContains(t, seen, m, "%s and %s share mark %#x", u, seen[m], m)
				seen[m] = u
			}
		}
	}
	// A lone unit sits at its home.
	lone, err := s.allocate(units[:1])
	require.NoError(t, err)
	require.Equal(t, s.mark(s.home(units[0])), lone[units[0]])
	// Too many units for the space.
	var many []markUnit
	for i := range 16 {
		many = append(many, unit(string(rune('a'+i)), servicelb.IPv4))
	}
	_, err = s.allocate(many)
	require.ErrorIs(t, err, servicelb.ErrCapacity)
}
