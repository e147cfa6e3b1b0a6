//go:build linux

package ebpf

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLayoutSizes: each key and value type is the size of its map's
// entries, as the programs address them.
func TestLayoutSizes(t *testing.T) {
	specs := mapSpecs(Sizes{}.withDefaults())
	for _, tc := range []struct {
		name       string
		key, value any
	}{
		{mapFrontends, feKey{}, feVal{}},
		{mapSets, uint32(0), setVal{}},
		{mapSlots, slotKey{}, endpoint{}},
		{mapMembers, memberKey{}, uint32(0)},
		{mapAffinity, affKey{}, affVal{}},
		{mapReverse, revKey{}, endpoint{}},
		{mapConfig, uint32(0), cfgVal{}},
		{mapNames, uint32(0), nameVal{}},
	} {
		assert.Equal(t, int(specs[tc.name].KeySize), binary.Size(tc.key), "%s key", tc.name)
		assert.Equal(t, int(specs[tc.name].ValueSize), binary.Size(tc.value), "%s value", tc.name)
	}
	// The offsets the programs read: affVal.Last, revKey's endpoint.
	assert.Equal(t, 24, binary.Size(endpoint{})+4)
	assert.Equal(t, 8, binary.Size(uint64(0)))
}
