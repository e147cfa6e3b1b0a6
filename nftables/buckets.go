//go:build linux

package nftables

import (
	"cmp"
	"encoding/binary"
	"slices"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// bucketCounts shares buckets among the backends in proportion to their
// weights: as many as the weights divided by their greatest common
// divisor (one each when they are equal), so that the shares are exact;
// or, when those add up to more than buckets, all of them in proportion
// (largest remainder first), at least one each. It returns nil when there
// are more backends than buckets.
func bucketCounts(bs []servicelb.Backend) []uint32 {
	n := len(bs)
	if n == 0 || n > buckets {
		return nil
	}
	g := uint64(0)
	var total uint64
	for _, b := range bs {
		g = gcd(g, uint64(max(b.Weight, 1)))
		total += uint64(max(b.Weight, 1))
	}
	counts := make([]uint32, n)
	if total/g <= buckets {
		for i, b := range bs {
			counts[i] = uint32(uint64(max(b.Weight, 1)) / g)
		}
		return counts
	}
	rems := make([]uint64, n)
	sum := uint32(0)
	for i, b := range bs {
		share := uint64(max(b.Weight, 1)) * buckets
		counts[i] = uint32(share / total)
		rems[i] = share % total
		if counts[i] == 0 {
			counts[i], rems[i] = 1, 0
		}
		sum += counts[i]
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	// Largest remainders gain the missing buckets; when the floor of one
	// bucket each overshoots, the largest counts give buckets back.
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rems[b], rems[a]) })
	for i := 0; sum < buckets; i = (i + 1) % n {
		counts[order[i]]++
		sum++
	}
	for sum > buckets {
		big := 0
		for i := range counts {
			if counts[i] > counts[big] {
				big = i
			}
		}
		counts[big]--
		sum--
	}
	return counts
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// sum returns the number of buckets counts share.
func sum(counts []uint32) uint32 {
	var s uint32
	for _, c := range counts {
		s += c
	}
	return s
}

// bucketOwners returns the backend each of a spread's n buckets goes to
// (an index into bs), counts[i] buckets to bs[i]. The assignment is a
// function of the backends alone, whatever came before, so a table
// written by changes is the table a fresh sync writes; and it moves few
// buckets when the backends change, so a change of endpoints is a change
// of few elements: an endpoint replaced moves about log n buckets
// (TestBucketOwnersMoveLittle), where an assignment in the order of the
// backends would move every bucket between the old endpoint's place and
// the new one's.
//
// Each of a backend's buckets is a ticket, with a hash of the backend's
// address, port and the ticket's number. In rounds, each ticket not yet
// placed asks for the first bucket still free in a sequence of its own
// (jumpHash: the same sequence for n and n+1 buckets but for one bucket
// in n, so a change of n moves little too); a bucket asked for by several
// tickets goes to the one that ranks highest for it (outranks), the
// others ask again in the next round. Every round places at least one ticket;
// about log n rounds place them all.
//
// Its scratch (and the slice it returns) comes from a.
func bucketOwners(bs []servicelb.Backend, counts []uint32, n uint32, a *arena) []int32 {
	// held[b] is the ticket that holds bucket b, plus one (0: free), and
	// at the end the backend that owns it; asked[b] the ticket that asks
	// for it in this round, plus one; left the tickets not yet placed,
	// touched the buckets asked for in this round.
	ints := a.int32s(4 * int(n))
	held, asked, left, touched := ints[:n:n], ints[n:2*n:2*n], ints[2*n:3*n:3*n], ints[3*n:3*n]
	if len(bs) == 1 {
		return held
	}
	tickets := a.tickets(int(n))
	for i, b := range bs {
		x := b.Addr.As16()
		h := mix(binary.BigEndian.Uint64(x[:8]) ^ mix(binary.BigEndian.Uint64(x[8:])^uint64(b.Port)))
		for j := range counts[i] {
			tickets = append(tickets, ticket{id: mix(h + uint64(j)*golden), backend: int32(i)})
		}
	}
	for i := range left {
		left[i] = int32(i)
	}
	for len(left) > 0 {
		touched = touched[:0]
		next := left[:0]
		for _, t := range left {
			tk := &tickets[t]
			b := tk.bucket(held, n)
			switch o := asked[b]; {
			case o == 0:
				asked[b] = t + 1
				touched = append(touched, int32(b))
			case outranks(tk.id, tickets[o-1].id, t, o-1, b):
				asked[b] = t + 1
				next = append(next, o-1)
			default:
				next = append(next, t)
			}
		}
		for _, b := range touched {
			held[b], asked[b] = asked[b], 0
		}
		left = next
	}
	for b, t := range held {
		held[b] = tickets[t-1].backend
	}
	return held
}

// golden is 2^64 divided by the golden ratio: steps of it spread a
// counter's values over the whole range of a hash.
const golden = 0x9e3779b97f4a7c15

// ticket is one of a backend's buckets before it is placed: its hash, its
// backend, and how many buckets of its sequence it has tried.
type ticket struct {
	id      uint64
	backend int32
	tries   uint32
}

// bucket returns the first bucket of the ticket's sequence that held
// shows free. After many tries (rare: when few buckets are left free) it
// takes the lowest free bucket.
func (tk *ticket) bucket(held []int32, n uint32) uint32 {
	for ; tk.tries < 8*n+64; tk.tries++ {
		if b := jumpHash(mix(tk.id+uint64(tk.tries)*golden), n); held[b] == 0 {
			return b
		}
	}
	for b, h := range held {
		if h == 0 {
			return uint32(b)
		}
	}
	panic("nftables: no bucket free for a ticket")
}

// outranks tells whether ticket t (hash id) ranks above ticket o (hash
// oid) for bucket b; the lower number wins a tie of hashes.
func outranks(id, oid uint64, t, o int32, b uint32) bool {
	x := mix(uint64(b) + golden)
	return cmp.Or(cmp.Compare(mix(id^x), mix(oid^x)), cmp.Compare(o, t)) > 0
}

// jumpHash returns a bucket below n for key: Lamping and Veach's jump
// consistent hash, in integers. For n+1 buckets it returns what it
// returns for n but for a key in n+1, which it moves to bucket n.
func jumpHash(key uint64, n uint32) uint32 {
	var b, j uint64 = 0, 0
	for j < uint64(n) {
		b = j
		key = key*2862933555777941757 + 1
		j = (b + 1) << 31 / (key>>33 + 1)
	}
	return uint32(b)
}

// mix is a 64-bit finalizer (splitmix64's): every bit of x moves about
// half the bits of the result.
func mix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
