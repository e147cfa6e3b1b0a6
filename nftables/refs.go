//go:build linux

package nftables

import (
	"iter"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// refCounts counts the ports that need each shared element (ref): a map
// for IPv4 addresses, whose keys take 6 bytes, beside one for IPv6
// addresses. There is an element for about every endpoint (its hairpin
// pair), so the room a count takes is the model's largest part after the
// State's.
type refCounts struct {
	v4 map[refKey4]int32
	v6 map[refKey]int32
}

// refKey4 is a refKey of an IPv4 set.
type refKey4 struct {
	set setID
	a   [4]byte
}

func newRefCounts() refCounts {
	return refCounts{v4: map[refKey4]int32{}, v6: map[refKey]int32{}}
}

func key4(k refKey) refKey4 { return refKey4{k.set, netip.AddrFrom16(k.a).Unmap().As4()} }

func (k refKey4) key() refKey { return refKey{k.set, netip.AddrFrom4(k.a).As16()} }

// get returns k's count, 0 when no port needs it.
func (c *refCounts) get(k refKey) int32 {
	if k.set.family() == servicelb.IPv4 {
		return c.v4[key4(k)]
	}
	return c.v6[k]
}

// put sets k's count; a count of zero or less forgets k.
func (c *refCounts) put(k refKey, n int32) {
	if k.set.family() == servicelb.IPv4 {
		if n > 0 {
			c.v4[key4(k)] = n
		} else {
			delete(c.v4, key4(k))
		}
		return
	}
	if n > 0 {
		c.v6[k] = n
	} else {
		delete(c.v6, k)
	}
}

// inc counts one port more needing k.
func (c *refCounts) inc(k refKey) {
	if k.set.family() == servicelb.IPv4 {
		c.v4[key4(k)]++
	} else {
		c.v6[k]++
	}
}

// len returns the number of elements some port needs.
func (c *refCounts) len() int { return len(c.v4) + len(c.v6) }

// all yields each element some port needs, with its count.
func (c *refCounts) all() iter.Seq2[refKey, int32] {
	return func(yield func(refKey, int32) bool) {
		for k, n := range c.v4 {
			if !yield(k.key(), n) {
				return
			}
		}
		for k, n := range c.v6 {
			if !yield(k, n) {
				return
			}
		}
	}
}
