//go:build linux

package ipvs

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math/bits"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// markUnit is what one firewall mark stands for: the flows to a service
// port's frontends that go elsewhere than the frontends' own virtual
// servers, to one set of the port's endpoints (ToCluster, ToLocal), or to
// none (Reject). Its mark names the firewall-mark virtual server those
// flows take.
type markUnit struct {
	key    servicelb.ServicePortKey
	action servicelb.Action
}

func (u markUnit) String() string { return u.key.String() + " " + u.action.String() }

func compareUnits(a, b markUnit) int {
	return cmp.Or(a.key.Compare(b.key), cmp.Compare(a.action, b.action))
}

// markSpace is the set of marks the proxier gives firewall-mark virtual
// servers: every value made of the bits of mask but zero. Slot n (from 1)
// is the mark whose mask bits, read from the lowest, spell n.
type markSpace struct{ mask uint32 }

// slots returns the number of marks.
func (s markSpace) slots() uint64 { return 1<<bits.OnesCount32(s.mask) - 1 }

// mark returns the mark of slot n: n's bits deposited into the mask's.
func (s markSpace) mark(n uint64) uint32 {
	var m uint32
	for rest := s.mask; rest != 0 && n != 0; rest &= rest - 1 {
		if n&1 != 0 {
			m |= rest & -rest
		}
		n >>= 1
	}
	return m
}

// owns reports whether a firewall mark is one the proxier may give: it has
// bits of the mask (a masquerade bit aside).
func (s markSpace) owns(fwmark uint32) bool { return fwmark&s.mask != 0 }

// home returns the slot a unit's mark is taken from when it is free: a
// hash of the unit, so that the same unit gets the same mark in every
// process.
func (s markSpace) home(u markUnit) uint64 {
	h := fnv.New64a()
	h.Write([]byte(u.String()))
	return 1 + h.Sum64()%s.slots()
}

// allocate gives each unit a mark, the same for the same set of units
// whatever came before: each family's units in order of home slot and
// name take the first free slot from their home on. A unit keeps its mark
// unless a unit whose home lies at or before its slot comes or goes.
// Marks are per family (IPVS looks firewall-mark virtual servers up by
// mark and family), so each family has the whole space.
func (s markSpace) allocate(units []markUnit) (map[markUnit]uint32, error) {
	out := make(map[markUnit]uint32, len(units))
	byFamily := map[servicelb.Family][]markUnit{}
	for _, u := range units {
		byFamily[u.key.Family] = append(byFamily[u.key.Family], u)
	}
	for _, f := range families() {
		us := byFamily[f]
		if uint64(len(us)) > s.slots() {
			return nil, s.exhausted(us)
		}
		homes := make(map[markUnit]uint64, len(us))
		for _, u := range us {
			homes[u] = s.home(u)
		}
		slices.SortFunc(us, func(a, b markUnit) int { return cmp.Or(cmp.Compare(homes[a], homes[b]), compareUnits(a, b)) })
		taken := make(map[uint64]bool, len(us))
		for _, u := range us {
			n := homes[u]
			for taken[n] {
				if n = n%s.slots() + 1; n == homes[u] {
					return nil, s.exhausted(us)
				}
			}
			taken[n] = true
			out[u] = s.mark(n)
		}
	}
	return out, nil
}

// exhausted reports more units than marks, naming the last service.
func (s markSpace) exhausted(us []markUnit) error {
	u := slices.MaxFunc(us, compareUnits)
	return &servicelb.ValidationError{Service: u.key.Service, Field: "ports", Value: u.key.String(),
		Err: fmt.Errorf("%w: the ipvs backend has %d firewall marks per family (Options.FWMarkMask %#x) and needs %d",
			servicelb.ErrCapacity, s.slots(), s.mask, len(us))}
}
