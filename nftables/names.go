//go:build linux

package nftables

import (
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// Names of the table's fixed chains.
const (
	chainNatPrerouting  = "nat-prerouting"
	chainNatOutput      = "nat-output"
	chainNatPostrouting = "nat-postrouting"
	chainServices       = "services"
	chainMasquerading   = "masquerading"
	chainMarkMasq       = "mark-for-masquerade"
)

// fam returns "4" or "6", the suffix of every per-family name.
func fam(f servicelb.Family) string {
	if f == servicelb.IPv6 {
		return "6"
	}
	return "4"
}

// portName is "<service>/<port>". Port names cannot contain "/", so the
// last "/" always separates the two and distinct ports get distinct names.
func portName(k servicelb.ServicePortKey) string { return k.Service + "/" + k.Port }

// Per service port chains. Each prefix ends in the family and a "-", and
// no prefix is another's prefix followed by a valid service name, so names
// of different kinds never meet.
func chainInternal(k servicelb.ServicePortKey) string {
	return "svc" + fam(k.Family) + "-" + portName(k)
}
func chainExternal(k servicelb.ServicePortKey) string {
	return "ext" + fam(k.Family) + "-" + portName(k)
}
func chainCluster(k servicelb.ServicePortKey) string {
	return "cluster" + fam(k.Family) + "-" + portName(k)
}
func chainLocal(k servicelb.ServicePortKey) string {
	return "local" + fam(k.Family) + "-" + portName(k)
}

// validTableName reports whether name is an nft identifier that nft can
// parse back: a letter, "_" or "." followed by letters, digits, "/", "-",
// "_" or ".".
func validTableName(name string) bool {
	if name == "" || len(name) > 255 {
		return false
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == '.':
		case i > 0 && (c >= '0' && c <= '9' || c == '/' || c == '-'):
		default:
			return false
		}
	}
	return true
}

// Load balancing slots. Every load-balancing chain without affinity (the
// cluster-wide or the local endpoints of one service port) owns a slot: a
// range of bucketStride keys in the backends maps, from slot*bucketStride.
// Its rule draws "numgen random mod 4095" plus that offset and looks the
// result up in an interval map whose ranges, one per endpoint, are sized by
// weight. Changing endpoints then changes map elements only, never rules.
const (
	bucketBits   = 12
	bucketStride = 1 << bucketBits
	// buckets is the number of draws per slot. One less than the stride
	// leaves a gap between slots, so a slot's closing interval end never
	// shares a key with the next slot's first interval start.
	buckets  = bucketStride - 1
	maxSlots = 1 << (32 - bucketBits)
	// shards is the number of backends maps per family. Every rule that
	// reads a map is bound to it, and the kernel walks a map's bindings
	// each time it adds an element with data, and each time it binds a
	// new rule, and walks a whole map to rebuild its lookup after a commit
	// that changed it; but it finds a map by name by walking the table's
	// list of sets. Spreading slots over a constant number of maps keeps
	// those walks short at any scale; 512 weighs them against each other
	// at tens of thousands of ports.
	shards = 512
)

// slotKey names a load-balancing chain.
type slotKey struct {
	port  servicelb.ServicePortKey
	local bool
}

// home is the slot a key tries first: a hash of its name, so that a fresh
// Proxier (after a restart, or in a test that applies the final state of a
// long history) gives each chain the same slot when no two collide.
func (k slotKey) home() uint32 {
	h := fnv.New32a()
	h.Write([]byte(k.port.Service))
	h.Write([]byte{'|'})
	h.Write([]byte(k.port.Port))
	h.Write([]byte{'|', byte(k.port.Family), boolByte(k.local)})
	return h.Sum32() % maxSlots
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func (k slotKey) chain() string {
	if k.local {
		return chainLocal(k.port)
	}
	return chainCluster(k.port)
}

// endpointID identifies an endpoint in an affinity key.
func endpointID(ap netip.AddrPort) uint32 {
	h := fnv.New32a()
	b, _ := ap.MarshalBinary()
	h.Write(b)
	return h.Sum32()
}

// slotTable records the slots in use, per family. A port's plan holds the
// slots of its keys; new keys take free slots by linear probing from each
// key's home slot.
type slotTable struct {
	used [2]map[uint32]bool
}

func newSlotTable() *slotTable {
	return &slotTable{used: [2]map[uint32]bool{{}, {}}}
}

func famIndex(f servicelb.Family) int {
	if f == servicelb.IPv6 {
		return 1
	}
	return 0
}

// slotTxn records assignments and releases over a slotTable without
// changing it, until commit: a failed sync leaves the table as it was.
type slotTxn struct {
	base  *slotTable
	taken [2]map[uint32]bool
	freed [2]map[uint32]bool
}

func (t *slotTable) begin() *slotTxn {
	return &slotTxn{base: t, taken: [2]map[uint32]bool{{}, {}}, freed: [2]map[uint32]bool{{}, {}}}
}

// get assigns the key a free slot.
func (x *slotTxn) get(k slotKey) (uint32, error) {
	fi := famIndex(k.port.Family)
	s := k.home()
	for range maxSlots {
		if (!x.base.used[fi][s] || x.freed[fi][s]) && !x.taken[fi][s] {
			x.taken[fi][s] = true
			return s, nil
		}
		s = (s + 1) % maxSlots
	}
	return 0, capacityError(k.port, fmt.Sprintf("ports[%q]", k.port.Port), fmt.Sprintf("all %d load-balancing slots of %s are in use", maxSlots, k.port.Family))
}

// release frees slot s of family f at commit.
func (x *slotTxn) release(f servicelb.Family, s uint32) {
	fi := famIndex(f)
	if x.taken[fi][s] {
		delete(x.taken[fi], s)
		return
	}
	x.freed[fi][s] = true
}

func (x *slotTxn) commit() {
	for fi := range x.freed {
		for s := range x.freed[fi] {
			delete(x.base.used[fi], s)
		}
		for s := range x.taken[fi] {
			x.base.used[fi][s] = true
		}
	}
}
