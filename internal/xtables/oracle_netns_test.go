//go:build privileged || vm

package xtables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
	"github.com/kproxy-dev/kproxy/internal/testkit/netnstest"
)

// sameRaw reports whether two dumped rules have the same expressions,
// byte for byte.
func sameRaw(a, b []nfnl.RawExpr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}

// oracleCase is a rule to write both ways.
type oracleCase struct {
	name string
	rule Rule
	// cmdline, when set, is the rule as kube-proxy writes it (any match
	// order); it must give the same expressions as rule.
	cmdline string
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func oracleCases(f Family, table TableName) []oracleCase {
	v4 := f == IPv4
	pick := func(a, b string) string {
		if v4 {
			return a
		}
		return b
	}
	vip := pfx(pick("172.30.0.41/32", "fd00:96::29/128"))
	ep := pfx(pick("10.180.0.1/32", "fd00:180::1/128"))
	cluster := pfx(pick("10.0.0.0/8", "fd00:244::/48"))
	odd := pfx(pick("10.96.0.0/20", "fd00:244::/47"))
	to := netip.MustParseAddrPort(pick("10.180.0.1:80", "[fd00:180::1]:80"))
	jump := Jump("KX-T")
	if table == Mangle {
		return []oracleCase{
			{name: "set-mark", rule: Rule{Dst: vip, Proto: ProtoTCP, Matches: []Match{Port{ProtoTCP, 80}}, Target: SetMark{Value: 0x10000, Mask: 0xffffffff}},
				cmdline: `-d ` + vip.String() + ` -p tcp -m tcp --dport 80 -j MARK --set-mark 0x10000`},
			{name: "set-mark-sctp", rule: Rule{Dst: vip, Proto: ProtoSCTP, Matches: []Match{Port{ProtoSCTP, 9}}, Target: SetMark{Value: 0x24000, Mask: 0xffffffff}}},
			{name: "unmarked-drop", rule: Rule{Matches: []Match{Set{Name: "KX-SET2", Index: 1, Dirs: []SetDir{SetDst, SetDst}}, Mark{Value: 0, Mask: 0x0fff0000}}, Target: Drop},
				cmdline: `-m set --match-set KX-SET2 dst,dst -m mark --mark 0x0/0xfff0000 -j DROP`},
			{name: "source-range-drop", rule: Rule{Matches: []Match{Set{Name: "KX-SET2", Index: 1, Dirs: []SetDir{SetDst, SetDst}},
				Set{Name: "KX-SET3", Index: 2, Dirs: []SetDir{SetDst, SetDst, SetSrc}, Invert: true}}, Target: Drop}},
			{name: "unallocated-drop", rule: Rule{Dst: odd, Matches: []Match{AddrType{Dst: AddrTypeLocal, NotDst: true}, Conntrack{States: CtNew}}, Target: Drop},
				cmdline: `-d ` + odd.String() + ` -m addrtype ! --dst-type LOCAL -m conntrack --ctstate NEW -j DROP`},
			{name: "pod-jump", rule: Rule{Src: cluster, Target: jump}},
			{name: "pod-goto", rule: Rule{Src: cluster, Target: Goto("KX-T")}},
			{name: "goto", rule: Rule{Target: Goto("KX-T")}},
		}
	}
	if table == Filter {
		return []oracleCase{
			{name: "ctstate-new", rule: Rule{Matches: []Match{Conntrack{States: CtNew}, Comment("kubernetes service portals")}, Target: jump},
				cmdline: `-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KX-T`},
			{name: "ctstate-not", rule: Rule{Matches: []Match{Conntrack{States: CtRelated | CtEstablished | CtDNAT, Invert: true}}, Target: Accept}},
			{name: "ctstate-invalid", rule: Rule{Matches: []Match{Conntrack{States: CtInvalid}}, Target: Drop}},
			{name: "mark-accept", rule: Rule{Matches: []Match{Comment("kubernetes forwarding rules"), Mark{Value: 0x4000, Mask: 0x4000}}, Target: Accept}},
			{name: "mark-full", rule: Rule{Matches: []Match{Mark{Value: 0x8000, Mask: 0xffffffff}}, Target: Drop}},
			{name: "reject", rule: Rule{Dst: vip, Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80 has no endpoints"), Port{ProtoTCP, 80}}, Target: Reject{}},
				cmdline: `-m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp -p tcp -d ` + vip.String() + ` --dport 80 -j REJECT`},
			{name: "reject-udp", rule: Rule{Dst: vip, Proto: ProtoUDP, Matches: []Match{Comment("x"), Port{ProtoUDP, 53}}, Target: Reject{}}},
			{name: "nodeport-drop", rule: Rule{Proto: ProtoTCP, Matches: []Match{Comment("ns/s:p has no local endpoints"), AddrType{Dst: AddrTypeLocal}, Port{ProtoTCP, 30001}}, Target: Drop},
				cmdline: `-m comment --comment "ns/s:p has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30001 -j DROP`},
			{name: "sctp-reject", rule: Rule{Dst: vip, Proto: ProtoSCTP, Matches: []Match{Comment("s"), Port{ProtoSCTP, 3001}}, Target: Reject{}}},
			{name: "drop-cidr", rule: Rule{Dst: odd, Matches: []Match{Comment("cidr")}, Target: Drop}},
			{name: "accept-hc", rule: Rule{Proto: ProtoTCP, Matches: []Match{Comment(`quote " and \ back`), Port{ProtoTCP, 30500}}, Target: Accept}},
			{name: "ifaces", rule: Rule{In: "eth0", Out: "veth+", NotOut: true, Matches: []Match{Comment("if")}, Target: Accept}},
			{name: "set-match", rule: Rule{Matches: []Match{Set{Name: "KX-SET", Index: 0, Dirs: []SetDir{SetDst}}}, Target: Accept}},
			{name: "set-not", rule: Rule{Matches: []Match{Set{Name: "KX-SET", Index: 0, Dirs: []SetDir{SetSrc}, Invert: true}}, Target: Drop}},
			{name: "return", rule: Rule{Target: Return}},
		}
	}
	return []oracleCase{
		{name: "cluster-ip", rule: Rule{Dst: vip, Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80 cluster IP"), Port{ProtoTCP, 80}}, Target: jump},
			cmdline: `-m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d ` + vip.String() + ` --dport 80 -j KX-T`},
		{name: "masq-offcluster", rule: Rule{Src: cluster, NotSrc: true, Dst: vip, Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80 cluster IP"), Port{ProtoTCP, 80}}, Target: jump},
			cmdline: `-m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d ` + vip.String() + ` --dport 80 ! -s ` + cluster.String() + ` -j KX-T`},
		{name: "hairpin", rule: Rule{Src: ep, Matches: []Match{Comment("ns1/svc1:p80")}, Target: jump},
			cmdline: `-m comment --comment ns1/svc1:p80 -s ` + ep.String() + ` -j KX-T`},
		{name: "affinity-check", rule: Rule{Matches: []Match{Comment("ns1/svc1:p80 -> ep"), Recent{Name: "KX-T", Mode: RecentCheck, Seconds: 10800, Reap: true}}, Target: jump}},
		{name: "statistic", rule: Rule{Matches: []Match{Comment("ns1/svc1:p80 -> ep"), Probability(0.3333333333)}, Target: jump},
			cmdline: `-m comment --comment "ns1/svc1:p80 -> ep" -m statistic --mode random --probability 0.3333333333 -j KX-T`},
		{name: "statistic-small", rule: Rule{Matches: []Match{Probability(0.0000152590)}, Target: jump},
			cmdline: `-m statistic --mode random --probability 0.0000152590 -j KX-T`},
		{name: "dnat-affinity", rule: Rule{Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80"), Recent{Name: "KX-T", Mode: RecentSet}, Port{Proto: ProtoTCP}}, Target: DNAT{to}}},
		{name: "dnat-tcp", rule: Rule{Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80"), Port{Proto: ProtoTCP}}, Target: DNAT{to}},
			cmdline: `-m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination ` + to.String()},
		{name: "dnat-udp", rule: Rule{Proto: ProtoUDP, Matches: []Match{Port{Proto: ProtoUDP}}, Target: DNAT{to}}},
		{name: "dnat-sctp", rule: Rule{Proto: ProtoSCTP, Matches: []Match{Port{Proto: ProtoSCTP}}, Target: DNAT{to}}},
		{name: "nodeport-udp", rule: Rule{Proto: ProtoUDP, Matches: []Match{Comment("ns/s:dns"), Port{ProtoUDP, 30053}}, Target: jump}},
		{name: "nodeport-sctp", rule: Rule{Proto: ProtoSCTP, Matches: []Match{Comment("ns/s:x"), Port{ProtoSCTP, 30132}}, Target: jump}},
		{name: "addrtype-src", rule: Rule{Matches: []Match{Comment("masquerade LOCAL traffic"), AddrType{Src: AddrTypeLocal}}, Target: jump}},
		{name: "addrtype-not", rule: Rule{Dst: pfx(pick("127.0.0.0/8", "::1/128")), NotDst: true, Matches: []Match{AddrType{Dst: AddrTypeLocal, NotSrc: false}}, Target: jump}},
		{name: "mark-return", rule: Rule{Matches: []Match{Mark{Value: 0x4000, Mask: 0x4000, Invert: true}}, Target: Return},
			cmdline: `-m mark ! --mark 0x4000/0x4000 -j RETURN`},
		{name: "xor-mark", rule: Rule{Target: XorMark(0x4000)}, cmdline: `-j MARK --xor-mark 0x4000`},
		{name: "or-mark", rule: Rule{Target: OrMark(0x4000)}, cmdline: `-j MARK --or-mark 0x4000`},
		{name: "masquerade", rule: Rule{Matches: []Match{Comment("kubernetes service traffic requiring SNAT")}, Target: Masquerade{RandomFully: true}},
			cmdline: `-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`},
		{name: "masquerade-plain", rule: Rule{Target: Masquerade{}}},
		{name: "odd-prefix", rule: Rule{Src: odd, Target: jump}},
		{name: "comment-only", rule: Rule{Matches: []Match{Comment("other traffic will be dropped")}}},
		{name: "goto", rule: Rule{Proto: ProtoTCP, NotProto: true, Target: Goto("KX-T")}},
	}
}

// TestEncodingMatchesIptables writes every case both with
// iptables-nft-restore (given our rendering as input, and kube-proxy's own
// command line when the case has one) and through netlink, then compares
// the kernel's expressions byte for byte, and iptables-nft-save's
// rendering of our rules with ours.
func TestEncodingMatchesIptables(t *testing.T) {
	netnstest.Require(t, "nf_tables", "nft_compat", "nat", "ipset")
	for _, f := range []Family{IPv4, IPv6} {
		for _, table := range []TableName{NAT, Filter, Mangle} {
			t.Run(fmt.Sprintf("%s-%s", f, table), func(t *testing.T) {
				testEncoding(t, f, table)
			})
		}
	}
}

func saveCommand(f Family) (string, string) {
	if f == IPv6 {
		return "ip6tables-nft-save", "ip6tables-nft-restore"
	}
	return "iptables-nft-save", "iptables-nft-restore"
}

func testEncoding(t *testing.T, f Family, table TableName) {
	h := netnstest.NewHost(t, "xt")
	cases := oracleCases(f, table)
	saveCmd, restoreCmd := saveCommand(f)
	setFam := "inet"
	if f == IPv6 {
		setFam = "inet6"
	}
	h.Exec(t, "ipset", "create", "KX-SET", "hash:ip", "family", setFam)
	h.Exec(t, "ipset", "create", "KX-SET2", "hash:ip,port", "family", setFam)
	h.Exec(t, "ipset", "create", "KX-SET3", "hash:ip,port,net", "family", setFam)

	// iptables writes our rendering into KX-SAVE and kube-proxy's command
	// lines into KX-CMD.
	var in strings.Builder
	fmt.Fprintf(&in, "*%s\n:KX-T - [0:0]\n:KX-SAVE - [0:0]\n:KX-CMD - [0:0]\n", table)
	for _, c := range cases {
		in.Write(c.rule.AppendSave(nil, f, "KX-SAVE"))
		in.WriteByte('\n')
		if c.cmdline != "" {
			fmt.Fprintf(&in, "-A KX-CMD %s\n", c.cmdline)
		}
	}
	in.WriteString("COMMIT\n")
	h.ExecInput(t, in.String(), restoreCmd, "--noflush")

	tab := Table{f, table}
	var m msgWriter
	m.newChain(tab, "KX-OURS")
	for i := range cases {
		if _, err := m.addRule(tab, "KX-OURS", &cases[i].rule, position{}); err != nil {
			t.Fatalf("%s: encode: %v", cases[i].name, err)
		}
	}
	conn, err := nfnl.Open(nfnl.Options{NetNS: int(h.NS)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	if _, err := conn.Commit(ctx, &m.b); err != nil {
		t.Fatal(err)
	}
	dump := func(chain string) [][]nfnl.RawExpr {
		rules, err := conn.RulesRaw(ctx, nfnl.Family(f), string(table), chain)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]nfnl.RawExpr
		for _, r := range rules {
			out = append(out, r.Raw)
		}
		return out
	}
	saved, ours, cmd := dump("KX-SAVE"), dump("KX-OURS"), dump("KX-CMD")
	if len(saved) != len(cases) || len(ours) != len(cases) {
		t.Fatalf("rules: iptables wrote %d, we wrote %d, want %d", len(saved), len(ours), len(cases))
	}
	k := 0
	for i, c := range cases {
		if !sameRaw(saved[i], ours[i]) {
			t.Errorf("%s: expressions differ from iptables-nft-restore of %q:\n iptables %x\n ours     %x", c.name, c.rule.AppendSave(nil, f, "X"), saved[i], ours[i])
		}
		if c.cmdline != "" {
			if !sameRaw(cmd[k], ours[i]) {
				t.Errorf("%s: expressions differ from kube-proxy's %q:\n iptables %x\n ours     %x", c.name, c.cmdline, cmd[k], ours[i])
			}
			k++
		}
	}
	// iptables-nft-save prints our rules as we render them.
	var want strings.Builder
	for i := range cases {
		want.Write(cases[i].rule.AppendSave(nil, f, "KX-OURS"))
		want.WriteByte('\n')
	}
	var got strings.Builder
	for line := range strings.Lines(h.Exec(t, saveCmd, "-t", string(table))) {
		if strings.HasPrefix(line, "-A KX-OURS ") {
			got.WriteString(line)
		}
	}
	if got.String() != want.String() {
		t.Errorf("%s shows our rules as\n%s\nwant\n%s", saveCmd, got.String(), want.String())
	}
}
