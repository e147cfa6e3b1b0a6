//go:build linux

package xtables

import (
	"fmt"
	"net/netip"
)

// Family is the address family of an iptables table: iptables (IPv4) or
// ip6tables (IPv6). Its values are the kernel's NFPROTO numbers.
type Family uint8

// The families.
const (
	IPv4 Family = 2
	IPv6 Family = 10
)

// String returns "ip" or "ip6", as nft names the table families.
func (f Family) String() string {
	switch f {
	case IPv4:
		return "ip"
	case IPv6:
		return "ip6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// FamilyOf returns the family of an address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// addrLen returns the length of an address of the family in bytes.
func (f Family) addrLen() int {
	if f == IPv6 {
		return 16
	}
	return 4
}

// TableName is an iptables table. Only the tables service proxies use are
// supported.
type TableName string

// The tables.
const (
	Filter TableName = "filter"
	NAT    TableName = "nat"
	// Mangle is where packets are marked before routing and before the
	// hooks of IPVS and NAT.
	Mangle TableName = "mangle"
)

// Table names one table of one family, such as ip6 nat.
type Table struct {
	Family Family
	Name   TableName
}

func (t Table) String() string { return t.Family.String() + " " + string(t.Name) }

// BaseChain describes a builtin chain as iptables-nft creates it.
type BaseChain struct {
	Name     string
	Hook     uint32
	Priority int32
	// Type is the nf_tables chain type: "nat" or "filter".
	Type string
}

// Netfilter hook numbers.
const (
	hookPrerouting  = 0
	hookInput       = 1
	hookForward     = 2
	hookOutput      = 3
	hookPostrouting = 4
)

// BaseChains returns the builtin chains of a table in the order
// iptables-save lists them.
func BaseChains(t TableName) []BaseChain {
	switch t {
	case NAT:
		return []BaseChain{
			{"PREROUTING", hookPrerouting, -100, "nat"},
			{"INPUT", hookInput, 100, "nat"},
			{"OUTPUT", hookOutput, -100, "nat"},
			{"POSTROUTING", hookPostrouting, 100, "nat"},
		}
	case Filter:
		return []BaseChain{
			{"INPUT", hookInput, 0, "filter"},
			{"FORWARD", hookForward, 0, "filter"},
			{"OUTPUT", hookOutput, 0, "filter"},
		}
	case Mangle:
		// OUTPUT is a route chain: a packet whose mark it changes is
		// routed again.
		return []BaseChain{
			{"PREROUTING", hookPrerouting, -150, "filter"},
			{"INPUT", hookInput, -150, "filter"},
			{"FORWARD", hookForward, -150, "filter"},
			{"OUTPUT", hookOutput, -150, "route"},
			{"POSTROUTING", hookPostrouting, -150, "filter"},
		}
	}
	return nil
}

// IsBaseChain reports whether name is a builtin chain of table t.
func IsBaseChain(t TableName, name string) bool {
	for _, b := range BaseChains(t) {
		if b.Name == name {
			return true
		}
	}
	return false
}

// MaxChainNameLen is the longest chain name iptables accepts.
const MaxChainNameLen = 28

// Rule is one iptables rule: the address, interface and protocol matches
// every rule has, then extension matches in order, then a target. The zero
// value matches every packet and has no target.
//
// A Rule renders as the line iptables-save prints for it, and encodes into
// exactly the nf_tables expressions iptables-nft 1.8.9 writes for it, so
// that iptables-nft-save, iptables -S, -C and -D treat it as their own.
type Rule struct {
	// Src and Dst match the source and destination address; an invalid
	// prefix matches any. NotSrc and NotDst invert them (! -s, ! -d).
	Src, Dst       netip.Prefix
	NotSrc, NotDst bool
	// In and Out match the input and output interface (-i, -o); a name
	// ending in '+' matches every interface with that prefix.
	In, Out       string
	NotIn, NotOut bool
	// Proto matches the layer 4 protocol number (-p); zero matches any.
	Proto    uint8
	NotProto bool
	// Matches are the extension matches (-m), in order.
	Matches []Match
	// Target is what a matching packet does (-j); nil means nothing (the
	// rule only counts).
	Target Target
}

// Match is an extension match: Comment, Port, Statistic, Recent, Mark,
// AddrType, Conntrack or Set.
type Match interface {
	// appendSave appends the match as iptables-save prints it, with a
	// leading space.
	appendSave(b []byte, f Family) []byte
	// encode appends the match's expressions.
	encode(e *exprWriter, f Family) error
}

// Target is a rule's target: Jump, Goto, Verdict, DNAT, Masquerade,
// SetMark or Reject.
type Target interface {
	appendSave(b []byte, f Family) []byte
	encode(e *exprWriter, f Family) error
	// jumpsTo returns the chain the target jumps or goes to, if any.
	jumpsTo() string
}

// Protocol numbers.
const (
	ProtoTCP  = 6
	ProtoUDP  = 17
	ProtoSCTP = 132
)

// protoName returns the name iptables prints for a protocol number.
func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	case 1:
		return "icmp"
	case 58:
		return "ipv6-icmp"
	}
	return fmt.Sprint(p)
}

// Chain is a user chain with its rules.
type Chain struct {
	Name  string
	Rules []Rule
}

// Comment is -m comment --comment Text. Text is at most 255 bytes.
type Comment string

// Port is -m tcp, -m udp or -m sctp, with --dport when DPort is not zero.
type Port struct {
	// Proto is ProtoTCP, ProtoUDP or ProtoSCTP. The rule must also match
	// the protocol with Rule.Proto, as iptables requires.
	Proto uint8
	DPort uint16
}

// Statistic is -m statistic --mode random: the rule matches with the given
// probability. Build it with Probability.
type Statistic struct {
	// Random is the kernel's probability: the chance to match times 2^31.
	Random uint32
}

// Probability returns a Statistic that matches with probability p, as
// iptables rounds it (p given as text, such as kube-proxy's "%0.10f"
// rendering, gives the same rule as iptables given that text).
func Probability(p float64) Statistic {
	return Statistic{Random: probabilityBits(p)}
}

// RecentMode is what a recent match does.
type RecentMode uint8

// The recent modes used by session affinity.
const (
	// RecentSet adds the source address to the list (--set).
	RecentSet RecentMode = iota + 1
	// RecentCheck matches when the source address is on the list and was
	// seen within Seconds (--rcheck --seconds N --reap).
	RecentCheck
)

// Recent is -m recent: a named list of recently seen source addresses.
type Recent struct {
	Name    string
	Mode    RecentMode
	Seconds uint32
	// Reap removes entries older than Seconds as the list is checked.
	Reap bool
}

// Mark is -m mark [!] --mark Value/Mask.
type Mark struct {
	Value, Mask uint32
	Invert      bool
}

// Address types for AddrType.
const (
	AddrTypeLocal = 1 << 2
)

// AddrType is -m addrtype: --src-type and --dst-type (zero means not
// matched), each possibly inverted.
type AddrType struct {
	Src, Dst       uint16
	NotSrc, NotDst bool
}

// Conntrack states for Conntrack.States.
const (
	CtInvalid     = 1 << 0
	CtEstablished = 1 << 1
	CtRelated     = 1 << 2
	CtNew         = 1 << 3
	CtUntracked   = 1 << 4
	CtSNAT        = 1 << 6
	CtDNAT        = 1 << 7
)

// Conntrack is -m conntrack [!] --ctstate States.
type Conntrack struct {
	States uint16
	Invert bool
}

// SetDir says which packet address a dimension of a Set match uses.
type SetDir uint8

// The directions.
const (
	SetSrc SetDir = iota + 1
	SetDst
)

// Set is -m set [!] --match-set Name dir[,dir...]: it matches when the
// packet's addresses and ports, one per dimension, are in the ipset. Index
// is the kernel's index of the set in the target network namespace, which
// the caller looks up (it changes when the set is re-created); Name is only
// printed.
type Set struct {
	Name   string
	Index  uint16
	Dirs   []SetDir
	Invert bool
}

// Jump is -j CHAIN.
type Jump string

// Goto is -g CHAIN.
type Goto string

// Verdict is -j ACCEPT, DROP or RETURN.
type Verdict string

// The verdicts.
const (
	Accept Verdict = "ACCEPT"
	Drop   Verdict = "DROP"
	Return Verdict = "RETURN"
)

// DNAT is -j DNAT --to-destination To.
type DNAT struct {
	To netip.AddrPort
}

// Masquerade is -j MASQUERADE, with --random-fully when RandomFully.
type Masquerade struct {
	RandomFully bool
}

// SetMark is -j MARK --set-xmark Value/Mask: the packet mark becomes
// (mark &^ Mask) ^ Value. Use OrMark and XorMark for the usual forms.
type SetMark struct {
	Value, Mask uint32
}

// OrMark returns the target of -j MARK --or-mark m.
func OrMark(m uint32) SetMark { return SetMark{Value: m, Mask: m} }

// XorMark returns the target of -j MARK --xor-mark m.
func XorMark(m uint32) SetMark { return SetMark{Value: m} }

// Reject is -j REJECT --reject-with icmp-port-unreachable (or
// icmp6-port-unreachable in IPv6 tables), which a TCP client sees as a
// refused connection.
type Reject struct{}
