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

// chainBalance names the shared chain that spreads the flows of every
// port without affinity over its cluster endpoints ("cluster4") or its
// local ones ("local4").
func chainBalance(f servicelb.Family, local bool) string {
	if local {
		return "local" + fam(f)
	}
	return "cluster" + fam(f)
}

// Verdict shapes. A port without affinity has no chain of its own: each of
// its frontends goes to the shared chain of its verdicts (a shape), named
// after them and numbered by a code of three bits per origin, the action
// and whether it masquerades.
const shapeCodes = 1 << (3 * origins)

func shapeCode(vs servicelb.Verdicts) uint16 {
	var c uint16
	for o, v := range vs {
		c |= (uint16(v.Action)&3 | uint16(boolByte(v.Masquerade))<<2) << (3 * o)
	}
	return c
}

func shapeVerdicts(c uint16) servicelb.Verdicts {
	var vs servicelb.Verdicts
	for o := range vs {
		b := c >> (3 * o)
		vs[o] = servicelb.Verdict{Action: servicelb.Action(b & 3), Masquerade: b&4 != 0}
	}
	return vs
}

// shapeName is the name of a shape's chain and of its set of frontends:
// "verdicts4/outside-cluster-masq/pod-cluster/node-cluster-masq".
func shapeName(f string, vs servicelb.Verdicts) string {
	b := []byte("verdicts" + f)
	for _, o := range servicelb.Origins() {
		b = append(b, '/')
		b = append(b, o.String()...)
		b = append(b, '-')
		b = append(b, vs[o].Action.String()...)
		if vs[o].Masquerade {
			b = append(b, "-masq"...)
		}
	}
	return string(b)
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

// Buckets. A frontend's cluster (or local) endpoints share the numbers
// from 0 (from bucketStride) up to the number of buckets of the set, each
// endpoint as many as its weight asks for; the rule that translates draws
// one at random. A port with affinity holds a slot instead: a number that
// tells its pins apart from other ports' in the affinity sets.
const (
	bucketBits   = 12
	bucketStride = 1 << bucketBits
	// buckets is the most buckets one set of endpoints spreads over,
	// and the most endpoints it may have.
	buckets  = bucketStride - 1
	maxSlots = 1 << (32 - bucketBits)
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
