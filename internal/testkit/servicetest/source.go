package servicetest

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
)

// Source returns a rand.Source that draws its numbers from data, eight
// bytes each, and then from a generator seeded with data: a fuzz target
// that builds its random states from it lets the fuzzer steer every
// choice a generator makes, and the same data always gives the same walk.
func Source(data []byte) rand.Source {
	h := fnv.New64a()
	h.Write(data)
	seed := h.Sum64()
	return &bytesSource{data: data, rest: rand.NewPCG(seed, ^seed)}
}

type bytesSource struct {
	data []byte
	rest rand.Source
}

func (s *bytesSource) Uint64() uint64 {
	if len(s.data) == 0 {
		return s.rest.Uint64()
	}
	var b [8]byte
	n := copy(b[:], s.data)
	s.data = s.data[n:]
	return binary.LittleEndian.Uint64(b[:])
}
