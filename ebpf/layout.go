//go:build linux

package ebpf

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kproxy-dev/kproxy/servicelb"
)

// The maps' names, as pinned under Options.PinPath and as bpftool lists
// them (the kernel keeps 15 characters of a map's name).
const (
	mapFrontends = "kp_frontends"
	mapSets      = "kp_sets"
	mapSlots     = "kp_slots"
	mapMembers   = "kp_members"
	mapAffinity  = "kp_affinity"
	mapReverse   = "kp_revnat"
	mapFlows     = "kp_udpflows"
	mapConfig    = "kp_config"
	mapNames     = "kp_names"
)

// mapNamesInOrder lists the maps in the order they are created and pinned.
var mapNamesInOrder = []string{mapFrontends, mapSets, mapSlots, mapMembers, mapAffinity, mapReverse, mapConfig, mapNames, mapFlows}

// An action is what a hook does with a new flow from one origin to a
// frontend.
type action uint8

const (
	// actPass leaves the socket's destination alone: the packet path
	// (Options.Packets) serves the flow.
	actPass action = iota
	// actReject fails the connect or send with ECONNREFUSED.
	actReject
	// actDrop fails it with EPERM, as a flow dropped on its way out.
	actDrop
	// actForward rewrites the destination to an endpoint of a set.
	actForward
)

func (a action) String() string {
	switch a {
	case actPass:
		return "pass"
	case actReject:
		return "reject"
	case actDrop:
		return "drop"
	case actForward:
		return "forward"
	}
	return "action?"
}

// feKey is a frontend: an address (IPv4 as IPv4-mapped IPv6, so that one
// map serves both families and dual-stack sockets), a port in network
// order and an IP protocol.
type feKey struct {
	Addr  [16]byte
	Port  [2]byte
	Proto uint8
	Pad   uint8
}

// feVal is a frontend's action and set for the node's own sockets and for
// the sockets of other network namespaces (pods).
type feVal struct {
	NodeAct action
	PodAct  action
	Pad     [2]byte
	NodeSet uint32
	PodSet  uint32
}

// setVal is a set of endpoints: how many slots it has, and its ClientIP
// affinity timeout in seconds (0: none).
type setVal struct {
	Count   uint32
	Timeout uint32
}

// slotKey is one slot of a set. An endpoint holds as many slots as its
// weight asks for.
type slotKey struct {
	Set  uint32
	Slot uint32
}

// endpoint is an endpoint's address (IPv4-mapped for IPv4) and port in
// network order: a slot's value, and a reverse translation's value.
type endpoint struct {
	Addr [16]byte
	Port [2]byte
	Pad  [2]byte
}

// memberKey says an endpoint belongs to a set: an affinity pin is kept
// only while it does.
type memberKey struct {
	Set uint32
	Pad uint32
	endpoint
}

// affKey is a client's pin to a set: the client is its network
// namespace.
type affKey struct {
	Cookie uint64
	Set    uint32
	Pad    uint32
}

// affVal is the endpoint a client is pinned to and when it last used it
// (CLOCK_MONOTONIC, ns).
type affVal struct {
	endpoint
	Pad  uint32
	Last uint64
}

// revKey is a socket (its cookie) and the endpoint it was sent to.
type revKey struct {
	Cookie uint64
	endpoint
	Pad [4]byte
}

// cfgVal is the node-wide configuration: the cookie of the node's network
// namespace, which tells the node's sockets from pods'.
type cfgVal struct {
	NodeCookie uint64
}

// nameLen is the size of a set's name in kp_names.
const nameLen = 256

// nameVal names a set: "<service port key> cluster|local", for Dump and
// for a restarted process to find its sets again.
type nameVal [nameLen]byte

func newName(s string) nameVal {
	var n nameVal
	copy(n[:], s)
	return n
}

func (n nameVal) String() string {
	for i, b := range n {
		if b == 0 {
			return string(n[:i])
		}
	}
	return string(n[:])
}

func addr16(a netip.Addr) [16]byte {
	return a.As16() // IPv4 as ::ffff:a.b.c.d
}

func addrOf(b [16]byte) netip.Addr { return netip.AddrFrom16(b).Unmap() }

func port2(p uint16) [2]byte {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return b
}

func portOf(b [2]byte) uint16 { return binary.BigEndian.Uint16(b[:]) }

func newEndpoint(a netip.Addr, p uint16) endpoint { return endpoint{Addr: addr16(a), Port: port2(p)} }

func (e endpoint) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(addrOf(e.Addr), portOf(e.Port))
}

func (e endpoint) String() string { return e.AddrPort().String() }

func newFEKey(a netip.Addr, port uint16, p servicelb.Protocol) feKey {
	return feKey{Addr: addr16(a), Port: port2(port), Proto: p.Number()}
}

func (k feKey) String() string {
	proto := map[uint8]string{6: "tcp", 17: "udp"}[k.Proto]
	return netip.AddrPortFrom(addrOf(k.Addr), portOf(k.Port)).String() + "/" + proto
}

func (s Sizes) withDefaults() Sizes {
	if s.Frontends == 0 {
		s.Frontends = 1 << 16
	}
	if s.Slots == 0 {
		s.Slots = 1 << 18
	}
	if s.Affinity == 0 {
		s.Affinity = 1 << 14
	}
	if s.Reverse == 0 {
		s.Reverse = 1 << 16
	}
	return s
}

// mapSpecs returns the specs of the maps.
func mapSpecs(s Sizes) map[string]*ebpf.MapSpec {
	hash := func(name string, key, value, max uint32) *ebpf.MapSpec {
		return &ebpf.MapSpec{Name: name, Type: ebpf.Hash, KeySize: key, ValueSize: value, MaxEntries: max, Flags: unix.BPF_F_NO_PREALLOC}
	}
	lru := func(name string, key, value, max uint32) *ebpf.MapSpec {
		return &ebpf.MapSpec{Name: name, Type: ebpf.LRUHash, KeySize: key, ValueSize: value, MaxEntries: max}
	}
	sets := s.Frontends // a set per frontend at most
	return map[string]*ebpf.MapSpec{
		mapFrontends: hash(mapFrontends, 20, 12, s.Frontends),
		mapSets:      hash(mapSets, 4, 8, sets),
		mapSlots:     hash(mapSlots, 8, 20, s.Slots),
		mapMembers:   hash(mapMembers, 28, 4, s.Slots),
		mapAffinity:  lru(mapAffinity, 16, 32, s.Affinity),
		mapReverse:   lru(mapReverse, 32, 20, s.Reverse),
		mapConfig:    {Name: mapConfig, Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1},
		mapNames:     hash(mapNames, 4, nameLen, sets),
		mapFlows:     lru(mapFlows, 16, 32, s.Reverse),
	}
}

// layoutVersion names the meaning of the maps' keys and values. Raise it
// whenever the programs read or write an entry differently, even with
// sizes unchanged: the maps are then pinned anew (see layoutName).
const layoutVersion = 3

// mapDirPrefix starts the name of the directory under Options.PinPath
// that holds the maps of one layout.
const mapDirPrefix = "maps-"

// layoutName names the maps' layout: layoutVersion and a digest of every
// map's type, key and value sizes, bound and flags, which Options.Sizes
// changes. Maps are pinned under PinPath in a directory named after it,
// so that a Proxier of another layout (another version of this package,
// or other Sizes) makes its own beside them instead of adopting maps
// whose entries it would misread; see retireLayouts.
func layoutName(specs map[string]*ebpf.MapSpec) string {
	h := crc32.NewIEEE()
	for _, name := range mapNamesInOrder {
		s := specs[name]
		fmt.Fprintf(h, "%s %d %d %d %d %d;", name, s.Type, s.KeySize, s.ValueSize, s.MaxEntries, s.Flags)
	}
	return fmt.Sprintf("v%d-%08x", layoutVersion, h.Sum32())
}
