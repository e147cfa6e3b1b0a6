//go:build linux

package xtables

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// AppendSave appends the rule as iptables-save prints it in chain chain:
// "-A chain" followed by the matches and the target, without a newline.
// The text is canonical: what iptables-nft-save prints for the rule after
// it was written, whatever order the matches were given in on a command
// line.
func (r *Rule) AppendSave(b []byte, f Family, chain string) []byte {
	b = append(b, "-A "...)
	b = append(b, chain...)
	b = appendAddr(b, "-s", r.Src, r.NotSrc)
	b = appendAddr(b, "-d", r.Dst, r.NotDst)
	b = appendIface(b, "-i", r.In, r.NotIn)
	b = appendIface(b, "-o", r.Out, r.NotOut)
	if r.Proto != 0 {
		b = appendNot(b, r.NotProto)
		b = append(b, " -p "...)
		b = append(b, protoName(r.Proto)...)
	}
	for _, m := range r.Matches {
		b = m.appendSave(b, f)
	}
	if r.Target != nil {
		b = r.Target.appendSave(b, f)
	}
	return b
}

// String returns the rule as "-A <chain> ..." with the chain left as "X",
// for messages and tests; the family is taken from the addresses.
func (r *Rule) String() string {
	f := IPv4
	for _, p := range []netip.Prefix{r.Src, r.Dst} {
		if p.IsValid() {
			f = FamilyOf(p.Addr())
		}
	}
	return string(r.AppendSave(nil, f, "X"))
}

func appendNot(b []byte, not bool) []byte {
	if not {
		b = append(b, " !"...)
	}
	return b
}

func appendAddr(b []byte, flag string, p netip.Prefix, not bool) []byte {
	if !p.IsValid() || p.Bits() == 0 {
		return b
	}
	b = appendNot(b, not)
	b = append(b, ' ')
	b = append(b, flag...)
	b = append(b, ' ')
	return p.AppendTo(b)
}

func appendIface(b []byte, flag, name string, not bool) []byte {
	if name == "" {
		return b
	}
	b = appendNot(b, not)
	b = append(b, ' ')
	b = append(b, flag...)
	b = append(b, ' ')
	return append(b, name...)
}

// appendQuoted appends s as iptables-save prints strings: bare when it is
// made only of letters, digits, '_' and '-', else in double quotes with
// quotes and backslashes escaped.
func appendQuoted(b []byte, s string) []byte {
	if s != "" && strings.Trim(s, "_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") == "" {
		return append(b, s...)
	}
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' || s[i] == '\'' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

func (c Comment) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m comment --comment "...)
	return appendQuoted(b, string(c))
}

func (p Port) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m "...)
	b = append(b, protoName(p.Proto)...)
	if p.DPort != 0 {
		b = append(b, " --dport "...)
		b = strconv.AppendUint(b, uint64(p.DPort), 10)
	}
	return b
}

func (s Statistic) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m statistic --mode random --probability "...)
	return strconv.AppendFloat(b, float64(s.Random)/0x80000000, 'f', 11, 64)
}

func (r Recent) appendSave(b []byte, f Family) []byte {
	b = append(b, " -m recent"...)
	switch r.Mode {
	case RecentSet:
		b = append(b, " --set"...)
	case RecentCheck:
		b = append(b, " --rcheck --seconds "...)
		b = strconv.AppendUint(b, uint64(r.Seconds), 10)
		if r.Reap {
			b = append(b, " --reap"...)
		}
	}
	b = append(b, " --name "...)
	b = append(b, r.Name...)
	if f == IPv6 {
		b = append(b, " --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"...)
	} else {
		b = append(b, " --mask 255.255.255.255"...)
	}
	return append(b, " --rsource"...)
}

func (m Mark) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m mark"...)
	b = appendNot(b, m.Invert)
	b = append(b, " --mark "...)
	b = appendHex(b, m.Value)
	if m.Mask != 0xffffffff {
		b = append(b, '/')
		b = appendHex(b, m.Mask)
	}
	return b
}

func appendHex(b []byte, v uint32) []byte {
	b = append(b, "0x"...)
	return strconv.AppendUint(b, uint64(v), 16)
}

// addrTypeNames are the address types in the order libxt_addrtype prints
// them, by bit.
var addrTypeNames = []string{
	"UNSPEC", "UNICAST", "LOCAL", "BROADCAST", "ANYCAST", "MULTICAST",
	"BLACKHOLE", "UNREACHABLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE",
}

func appendAddrTypes(b []byte, t uint16) []byte {
	sep := byte(' ')
	for i, n := range addrTypeNames {
		if t&(1<<i) != 0 {
			b = append(b, sep)
			b = append(b, n...)
			sep = ','
		}
	}
	return b
}

func (a AddrType) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m addrtype"...)
	if a.Src != 0 {
		b = appendNot(b, a.NotSrc)
		b = append(b, " --src-type"...)
		b = appendAddrTypes(b, a.Src)
	}
	if a.Dst != 0 {
		b = appendNot(b, a.NotDst)
		b = append(b, " --dst-type"...)
		b = appendAddrTypes(b, a.Dst)
	}
	return b
}

var ctStateNames = []struct {
	bit  uint16
	name string
}{
	{CtInvalid, "INVALID"}, {CtNew, "NEW"}, {CtRelated, "RELATED"},
	{CtEstablished, "ESTABLISHED"}, {CtUntracked, "UNTRACKED"},
	{CtSNAT, "SNAT"}, {CtDNAT, "DNAT"},
}

func (c Conntrack) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m conntrack"...)
	b = appendNot(b, c.Invert)
	b = append(b, " --ctstate"...)
	sep := byte(' ')
	for _, s := range ctStateNames {
		if c.States&s.bit != 0 {
			b = append(b, sep)
			b = append(b, s.name...)
			sep = ','
		}
	}
	return b
}

func (s Set) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -m set"...)
	b = appendNot(b, s.Invert)
	b = append(b, " --match-set "...)
	b = append(b, s.Name...)
	for i, d := range s.Dirs {
		if i == 0 {
			b = append(b, ' ')
		} else {
			b = append(b, ',')
		}
		if d == SetSrc {
			b = append(b, "src"...)
		} else {
			b = append(b, "dst"...)
		}
	}
	return b
}

func (j Jump) appendSave(b []byte, _ Family) []byte {
	return append(append(b, " -j "...), j...)
}

func (g Goto) appendSave(b []byte, _ Family) []byte {
	return append(append(b, " -g "...), g...)
}

func (v Verdict) appendSave(b []byte, _ Family) []byte {
	return append(append(b, " -j "...), v...)
}

func (d DNAT) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -j DNAT --to-destination "...)
	return d.To.AppendTo(b)
}

func (m Masquerade) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -j MASQUERADE"...)
	if m.RandomFully {
		b = append(b, " --random-fully"...)
	}
	return b
}

func (m SetMark) appendSave(b []byte, _ Family) []byte {
	b = append(b, " -j MARK --set-xmark "...)
	b = appendHex(b, m.Value)
	b = append(b, '/')
	return appendHex(b, m.Mask)
}

func (Reject) appendSave(b []byte, f Family) []byte {
	if f == IPv6 {
		return append(b, " -j REJECT --reject-with icmp6-port-unreachable"...)
	}
	return append(b, " -j REJECT --reject-with icmp-port-unreachable"...)
}

// TableText is the content of one table to render as iptables-save text:
// the rules of builtin chains and the user chains.
type TableText struct {
	Name TableName
	// Base holds rules of builtin chains, by chain name.
	Base map[string][]Rule
	// Chains are user chains, in any order.
	Chains []Chain
}

// AppendSaveTable appends the table as iptables-nft-save prints it,
// without its comment lines: "*table", every builtin chain, the user
// chains sorted by name, the rules of builtin chains, the rules of user
// chains in the same order, and "COMMIT".
func AppendSaveTable(b []byte, f Family, t *TableText) []byte {
	b = append(b, '*')
	b = append(b, t.Name...)
	b = append(b, '\n')
	for _, bc := range BaseChains(t.Name) {
		b = fmt.Appendf(b, ":%s ACCEPT [0:0]\n", bc.Name)
	}
	chains := slices.Clone(t.Chains)
	slices.SortFunc(chains, func(x, y Chain) int { return cmp.Compare(x.Name, y.Name) })
	for _, c := range chains {
		b = append(b, ':')
		b = append(b, c.Name...)
		b = append(b, " - [0:0]\n"...)
	}
	for _, bc := range BaseChains(t.Name) {
		for i := range t.Base[bc.Name] {
			b = t.Base[bc.Name][i].AppendSave(b, f, bc.Name)
			b = append(b, '\n')
		}
	}
	for _, c := range chains {
		for i := range c.Rules {
			b = c.Rules[i].AppendSave(b, f, c.Name)
			b = append(b, '\n')
		}
	}
	return append(b, "COMMIT\n"...)
}

// StripSave removes the comment lines iptables-save adds and zeroes the
// chain counters, so that its output compares with AppendSaveTable's.
func StripSave(s string) string {
	var out strings.Builder
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, ":") {
			if i := strings.LastIndexByte(line, '['); i > 0 {
				line = line[:i] + "[0:0]\n"
			}
		}
		out.WriteString(line)
	}
	return out.String()
}
