//go:build linux

package xtables

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kproxy-dev/kproxy/internal/nfnl"
)

// TestAppendSave checks the text of every match and target against what
// iptables-nft-save prints (the privileged oracle test checks the same
// against the real tool; this one runs anywhere).
func TestAppendSave(t *testing.T) {
	pfx := netip.MustParsePrefix
	for _, tc := range []struct {
		f    Family
		r    Rule
		want string
	}{
		{IPv4, Rule{Dst: pfx("172.30.0.41/32"), Proto: ProtoTCP, Matches: []Match{Comment("ns1/svc1:p80 cluster IP"), Port{ProtoTCP, 80}}, Target: Jump("KUBE-SVC-X")},
			`-A C -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-X`},
		{IPv4, Rule{Src: pfx("10.0.0.0/8"), NotSrc: true, Matches: []Match{Comment("plain_name-1")}, Target: Jump("X")},
			`-A C ! -s 10.0.0.0/8 -m comment --comment plain_name-1 -j X`},
		{IPv4, Rule{Matches: []Match{Probability(0.3333333333)}, Target: Jump("X")},
			`-A C -m statistic --mode random --probability 0.33333333349 -j X`},
		{IPv4, Rule{Matches: []Match{Recent{Name: "X", Mode: RecentCheck, Seconds: 10800, Reap: true}}, Target: Jump("X")},
			`-A C -m recent --rcheck --seconds 10800 --reap --name X --mask 255.255.255.255 --rsource -j X`},
		{IPv6, Rule{Proto: ProtoUDP, Matches: []Match{Recent{Name: "X", Mode: RecentSet}, Port{Proto: ProtoUDP}}, Target: DNAT{netip.MustParseAddrPort("[fd00::1]:53")}},
			`-A C -p udp -m recent --set --name X --mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff --rsource -m udp -j DNAT --to-destination [fd00::1]:53`},
		{IPv4, Rule{Matches: []Match{Mark{Value: 0x4000, Mask: 0x4000, Invert: true}}, Target: Return},
			`-A C -m mark ! --mark 0x4000/0x4000 -j RETURN`},
		{IPv4, Rule{Matches: []Match{Mark{Value: 0x8000, Mask: 0xffffffff}}, Target: Drop}, `-A C -m mark --mark 0x8000 -j DROP`},
		{IPv4, Rule{Target: XorMark(0x4000)}, `-A C -j MARK --set-xmark 0x4000/0x0`},
		{IPv4, Rule{Target: OrMark(0x4000)}, `-A C -j MARK --set-xmark 0x4000/0x4000`},
		{IPv4, Rule{Matches: []Match{Conntrack{States: CtRelated | CtEstablished | CtDNAT, Invert: true}}, Target: Accept},
			`-A C -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j ACCEPT`},
		{IPv4, Rule{Proto: ProtoSCTP, Matches: []Match{AddrType{Dst: AddrTypeLocal}, Port{ProtoSCTP, 3001}}, Target: Reject{}},
			`-A C -p sctp -m addrtype --dst-type LOCAL -m sctp --dport 3001 -j REJECT --reject-with icmp-port-unreachable`},
		{IPv6, Rule{Target: Reject{}}, `-A C -j REJECT --reject-with icmp6-port-unreachable`},
		{IPv4, Rule{In: "eth0", Out: "veth+", NotOut: true, Target: Masquerade{RandomFully: true}},
			`-A C -i eth0 ! -o veth+ -j MASQUERADE --random-fully`},
		{IPv4, Rule{Matches: []Match{Set{Name: "S", Dirs: []SetDir{SetDst, SetDst}, Invert: true}}, Target: Goto("X")},
			`-A C -m set ! --match-set S dst,dst -g X`},
		{IPv4, Rule{Matches: []Match{Comment(`a "b" \c`)}}, `-A C -m comment --comment "a \"b\" \\c"`},
	} {
		if got := string(tc.r.AppendSave(nil, tc.f, "C")); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

func TestProbabilityBits(t *testing.T) {
	for _, tc := range []struct {
		p    float64
		want uint32
	}{{0.3333333333, 0x2aaaaaab}, {0.5, 0x40000000}, {0.0000152590, 32768}} {
		if got := Probability(tc.p).Random; got != tc.want {
			t.Errorf("Probability(%v) = %#x, want %#x", tc.p, got, tc.want)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	pfx := netip.MustParsePrefix
	for _, r := range []Rule{
		{Src: pfx("fd00::/64")},
		{Dst: pfx("10.0.0.1/8")},
		{NotSrc: true},
		{In: "a-very-long-interface-name"},
		{Matches: []Match{Comment(strings.Repeat("x", 256))}},
		{Matches: []Match{Recent{Name: "", Mode: RecentSet}}},
		{Matches: []Match{Port{Proto: 1, DPort: 1}}},
		{Target: Jump("THIS-CHAIN-NAME-IS-MUCH-TOO-LONG")},
		{Target: DNAT{netip.MustParseAddrPort("[fd00::1]:80")}},
		{Matches: []Match{Set{Name: "s"}}},
	} {
		if _, err := EncodeExprs(IPv4, &r); err == nil {
			t.Errorf("%s: encoded", r.String())
		}
	}
}

// TestSignatureAsDumped checks that a rule's signature is the same for the
// kernel's rendering of it: counters with values, xt info dumped shorter
// (statistic's kernel pointer left out), bitwise with its operation.
func TestSignatureAsDumped(t *testing.T) {
	r := Rule{Matches: []Match{Probability(0.25), Mark{Value: 1, Mask: 3}}, Target: Jump("X")}
	want, err := Signature(IPv4, &r)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := EncodeExprs(IPv4, &r)
	if err != nil {
		t.Fatal(err)
	}
	var dumped []nfnl.RawExpr
	for _, x := range raw {
		data := append([]byte(nil), x.Data...)
		switch x.Name {
		case "counter":
			binary.BigEndian.PutUint64(data[len(data)-8:], 42)
		case "match":
			if strings.Contains(string(data), "statistic") {
				// The info attribute, last, holds 24 bytes; the kernel
				// dumps the first 16.
				hdr := len(data) - 28
				data = data[:len(data)-8]
				binary.NativeEndian.PutUint16(data[hdr:], 4+16)
			}
		case "bitwise":
			// NFTA_BITWISE_OP 0: a header in host order, a value in
			// network order.
			data = binary.NativeEndian.AppendUint16(data, 8)
			data = binary.NativeEndian.AppendUint16(data, 6)
			data = append(data, 0, 0, 0, 0)
		}
		dumped = append(dumped, nfnl.RawExpr{Name: x.Name, Data: data})
	}
	got, jump, err := rawSig(dumped)
	if err != nil {
		t.Fatal(err)
	}
	if got != want || jump != "X" {
		t.Errorf("dumped signature %x jump %q, want %x and X", got, jump, want)
	}
	r.Target = Jump("Y")
	if other, _ := Signature(IPv4, &r); other == want {
		t.Error("another jump target gives the same signature")
	}
}

// recorder is a Conn that applies nothing and records the batches, and
// whose each message is.
type recorder struct {
	batches []string
	owners  [][]string
	gen     uint32
}

func (r *recorder) Generation(context.Context) (nfnl.Generation, error) {
	return nfnl.Generation{ID: r.gen}, nil
}

func (r *recorder) Commit(_ context.Context, b *nfnl.Batch) (nfnl.Generation, error) {
	r.batches = append(r.batches, b.String())
	var owners []string
	for i := range b.Len() {
		if o := b.Owner(i); o != nil {
			owners = append(owners, fmt.Sprintf("%s: %v", b.Describe(i), o))
		}
	}
	r.owners = append(r.owners, owners)
	r.gen++
	return nfnl.Generation{ID: r.gen}, nil
}

func (r *recorder) Tables(context.Context, nfnl.Family) ([]nfnl.Table, error) { return nil, nil }
func (r *recorder) Chains(context.Context, nfnl.Family, string) ([]nfnl.Chain, error) {
	return nil, nil
}
func (r *recorder) EachRule(context.Context, nfnl.Family, string, string, func(*nfnl.Rule) error) error {
	return nil
}

// TestCommitOrder checks the order of a batch's messages: rules deleted,
// chains flushed, then deleted, then created and filled, keyed rules and
// jumps last; and that an unchanged key sends nothing.
func TestCommitOrder(t *testing.T) {
	rec := &recorder{gen: 1}
	a := NewApplier(ApplierOptions{Conn: rec, Owns: func(_ TableName, c string) bool { return strings.HasPrefix(c, "K-") }})
	tab := Table{IPv4, NAT}
	want := &TableContent{
		Chains: map[string][]Rule{"K-A": {{Target: Return}}, "K-B": {{Target: Jump("K-A")}}},
		Keyed:  map[string]map[string][]Rule{"K-K": {"a": {{Target: Jump("K-B")}}}},
		Jumps:  map[string][]Rule{"PREROUTING": {{Target: Jump("K-K")}}},
	}
	if _, err := a.Reconcile(context.Background(), map[Table]*TableContent{tab: want}); err != nil {
		t.Fatal(err)
	}
	wantFirst := []string{
		"add table ip nat",
		"add chain ip nat PREROUTING", "add chain ip nat INPUT", "add chain ip nat OUTPUT", "add chain ip nat POSTROUTING",
		"add chain ip nat K-A", "add chain ip nat K-B", "add chain ip nat K-K",
		"add rule ip nat K-A", "add rule ip nat K-B", "add rule ip nat K-K", "insert rule ip nat PREROUTING",
	}
	if diff := cmp.Diff(wantFirst, strings.Split(strings.TrimSpace(rec.batches[0]), "\n")); diff != "" {
		t.Errorf("first batch (-want +got):\n%s", diff)
	}
	// The echoes a real kernel sends are missing: the Applier must load
	// again before the next commit.
	if a.Loaded() {
		t.Error("loaded without learning handles")
	}
}

// BenchmarkPlaceKeyed: placing the keys of a keyed chain costs what the
// chain holds, so its ns/key stays flat from 5,000 keys to 20,000 (a
// placement that inserted each key into a sorted list grew with the
// square).
func BenchmarkPlaceKeyed(b *testing.B) {
	tab := Table{IPv4, NAT}
	for _, n := range []int{5000, 20000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			tx := NewTx()
			tx.ResetKeyed(tab, "K-K")
			for i := range n {
				tx.SetKeyed(tab, "K-K", fmt.Sprintf("k%06d", i), []Rule{{Target: Return}})
			}
			for b.Loop() {
				bu, st := newBuilder(), newTableState()
				if err := bu.placeKeyed(tab, st, "K-K", tx.tables[tab].keyed["K-K"]); err != nil {
					b.Fatal(err)
				}
				if got := bu.m.count(); got != n {
					b.Fatalf("placed %d keys, want %d", got, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
		})
	}
}

// TestCommitOwners: the messages of a chain and of a key belong to their
// owners, as TableContent says; those of the table, the builtin and keyed
// chains and the jumps to no one.
func TestCommitOwners(t *testing.T) {
	rec := &recorder{gen: 1}
	a := NewApplier(ApplierOptions{Conn: rec, Owns: func(_ TableName, c string) bool { return strings.HasPrefix(c, "K-") }})
	tab := Table{IPv4, NAT}
	want := &TableContent{
		Chains:      map[string][]Rule{"K-A": {{Target: Return}, {Target: Return}}, "K-B": {{Target: Jump("K-A")}}, "K-N": {{Target: Return}}},
		Keyed:       map[string]map[string][]Rule{"K-K": {"a": {{Target: Jump("K-A")}}, "b": {{Target: Jump("K-B")}}, "tail": {{Target: Return}}}},
		Jumps:       map[string][]Rule{"PREROUTING": {{Target: Jump("K-K")}}},
		ChainOwners: map[string]any{"K-A": "port a", "K-B": "port b"},
		KeyOwners:   map[string]any{"a": "port a", "b": "port b"},
	}
	_, err := a.Reconcile(context.Background(), map[Table]*TableContent{tab: want})
	require.NoError(t, err)
	require.Len(t, rec.owners, 1)
	assert.Equal(t, []string{
		"add chain ip nat K-A: port a", "add chain ip nat K-B: port b",
		"add rule ip nat K-A: port a", "add rule ip nat K-A: port a", "add rule ip nat K-B: port b",
		"add rule ip nat K-K: port a", "add rule ip nat K-K: port b",
	}, rec.owners[0])
}
