//go:build linux

package nfnl

import (
	"fmt"
	"time"

	"github.com/google/nftables/expr"
)

// Family is an nf_tables address family (NFPROTO_*).
type Family uint8

// The address families.
const (
	Inet   Family = 1
	IPv4   Family = 2
	ARP    Family = 3
	NetDev Family = 5
	Bridge Family = 7
	IPv6   Family = 10
)

// String returns the family as nft writes it ("inet", "ip", "ip6", ...).
func (f Family) String() string {
	switch f {
	case Inet:
		return "inet"
	case IPv4:
		return "ip"
	case ARP:
		return "arp"
	case NetDev:
		return "netdev"
	case Bridge:
		return "bridge"
	case IPv6:
		return "ip6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// Hook numbers of the ip, ip6 and inet families (NF_INET_*).
const (
	HookPrerouting  uint32 = 0
	HookInput       uint32 = 1
	HookForward     uint32 = 2
	HookOutput      uint32 = 3
	HookPostrouting uint32 = 4
	HookIngress     uint32 = 5
)

// Verdict codes (NF_DROP, NF_ACCEPT and NFT_*).
const (
	VerdictDrop     int32 = 0
	VerdictAccept   int32 = 1
	VerdictContinue int32 = -1
	VerdictBreak    int32 = -2
	VerdictJump     int32 = -3
	VerdictGoto     int32 = -4
	VerdictReturn   int32 = -5
)

// Verdict is a verdict held by a set element (a verdict map's data) or a
// chain policy. Chain names the target of a jump or goto.
type Verdict struct {
	Code  int32
	Chain string
}

// String formats the verdict as nft does ("drop", "goto c", ...).
func (v Verdict) String() string {
	switch v.Code {
	case VerdictDrop:
		return "drop"
	case VerdictAccept:
		return "accept"
	case VerdictContinue:
		return "continue"
	case VerdictBreak:
		return "break"
	case VerdictJump:
		return "jump " + v.Chain
	case VerdictGoto:
		return "goto " + v.Chain
	case VerdictReturn:
		return "return"
	}
	return fmt.Sprintf("verdict(%d)", v.Code)
}

// Table is an nf_tables table.
type Table struct {
	Family Family
	Name   string
	Flags  uint32
	// UserData is opaque to the kernel; nft keeps comments in it.
	UserData []byte
	// Handle and Use (the number of chains, sets and objects in it) are
	// filled in by dumps and ignored when writing.
	Handle uint64
	Use    uint32
}

// Hook attaches a base chain to a netfilter hook.
type Hook struct {
	// Num is one of the Hook* constants.
	Num uint32
	// Priority orders chains on the same hook; lower runs first.
	Priority int32
	// Type is the chain type: "filter", "nat" or "route".
	Type string
	// Policy is the verdict for packets that reach the end of the chain:
	// VerdictAccept (the default when nil) or VerdictDrop.
	Policy *int32
	// Device is the interface of a netdev-family or ingress chain.
	Device string
}

// Chain is a chain: a base chain when Hook is set, else a regular chain
// reached by jumps and gotos.
type Chain struct {
	Family Family
	Table  string
	Name   string
	Hook   *Hook
	// UserData is opaque to the kernel; nft keeps comments in it.
	UserData []byte
	// Handle and Use (the number of references to the chain) are filled
	// in by dumps and ignored when writing.
	Handle uint64
	Use    uint32
}

// Compat is a rule's NFTA_RULE_COMPAT attribute, which x_tables matches and
// targets inside nf_tables (nft_compat) need: the layer 4 protocol the rule
// matches and the inversion flag (NFT_RULE_COMPAT_F_INV).
type Compat struct {
	Proto uint32
	Flags uint32
}

// Rule is a rule. Writers fill Exprs; dumps fill Raw (and Exprs where every
// expression is one DecodeExpr knows).
type Rule struct {
	Family Family
	Table  string
	Chain  string
	// Handle identifies an existing rule: the rule to replace in
	// Batch.ReplaceRule, or the rule a dump returned.
	Handle uint64
	// Position is a rule handle: Batch.AddRule places the rule after it
	// and Batch.InsertRule before it. Zero means the end (AddRule) or the
	// start (InsertRule) of the chain.
	Position uint64
	// ID names a rule added by a batch within that batch (NFTA_RULE_ID),
	// so that later rules of the same batch can be placed next to it with
	// PositionID before it has a handle. Zero means none.
	ID uint32
	// PositionID places the rule next to the rule of this batch whose ID
	// it is, as Position does for a handle: AddRule after it, InsertRule
	// before it.
	PositionID uint32
	Exprs      []expr.Any
	Compat     *Compat
	UserData   []byte
	// Raw holds the expressions as the kernel dumped them. When writing a
	// rule without Exprs, Raw is written as is: expressions encoded
	// elsewhere, or a dumped rule written back.
	Raw []RawExpr
	// Encoded, when writing a rule without Exprs and Raw, is the content
	// of its NFTA_RULE_EXPRESSIONS (the expressions' NFTA_LIST_ELEM
	// nests) encoded elsewhere, written as it is in one copy.
	Encoded []byte
}

// RawExpr is one expression of a dumped rule: its name ("payload", "cmp",
// "match", ...) and its NFTA_EXPR_DATA attribute, unparsed.
type RawExpr struct {
	Name string
	Data []byte
}

// Set flags (NFT_SET_*).
const (
	SetAnonymous uint32 = 0x1
	SetConstant  uint32 = 0x2
	SetInterval  uint32 = 0x4
	SetMap       uint32 = 0x8
	SetTimeout   uint32 = 0x10
	SetEval      uint32 = 0x20
	SetObject    uint32 = 0x40
	SetConcat    uint32 = 0x80
)

// TypeVerdict is the data type of a verdict map (NFT_DATA_VERDICT).
const TypeVerdict uint32 = 0xffffff00

// Set is a named set or map. KeyType and DataType are nft's datatype
// numbers (see the Type* constants); they only matter to nft, which prints
// elements by them, while the kernel looks at the lengths.
type Set struct {
	Family   Family
	Table    string
	Name     string
	Flags    uint32
	KeyType  uint32
	KeyLen   uint32
	DataType uint32
	DataLen  uint32
	// Size bounds the number of elements; zero means no bound.
	Size uint32
	// Fields holds the length of each field of a concatenated key. The
	// kernel needs it for a concatenation with intervals (SetConcat).
	Fields []uint32
	// Timeout is the default element timeout of a set with SetTimeout.
	Timeout time.Duration
	// UserData is opaque to the kernel; nft keeps the key's byte order,
	// "typeof" expressions and comments in it.
	UserData []byte
	// ID names a set created earlier in the same batch, for rules that
	// refer to it by ID; named sets are found by name, so it may stay zero.
	ID uint32
	// Handle is filled in by dumps.
	Handle uint64
}

// Element flags (NFT_SET_ELEM_*).
const (
	ElemIntervalEnd uint32 = 0x1
	ElemCatchall    uint32 = 0x2
)

// Element is a set element: a key, and in a map a value (Data) or a
// verdict (Verdict).
type Element struct {
	Key     []byte
	KeyEnd  []byte
	Data    []byte
	Verdict *Verdict
	Flags   uint32
	// Timeout overrides the set's default timeout when writing; Expires is
	// the time left, filled in by dumps.
	Timeout  time.Duration
	Expires  time.Duration
	UserData []byte
}

// Generation is the ruleset generation: it changes with every commit in
// the namespace, by anyone.
type Generation struct {
	ID uint32
	// PID and Process name the process whose commit made the generation,
	// when the kernel reports it.
	PID     uint32
	Process string
}

// nft datatype numbers for set keys and data (nft's include/datatype.h).
const (
	TypeInteger     uint32 = 4
	TypeIPv4Addr    uint32 = 7
	TypeIPv6Addr    uint32 = 8
	TypeInetProto   uint32 = 12
	TypeInetService uint32 = 13
	TypeMark        uint32 = 19
)

// ConcatType returns the datatype number nft gives a concatenation of the
// given types (six bits each, the first type in the highest bits).
func ConcatType(types ...uint32) uint32 {
	var t uint32
	for _, x := range types {
		t = t<<6 | x&0x3f
	}
	return t
}
