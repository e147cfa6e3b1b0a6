//go:build linux

package nfnl

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables/expr"

	"github.com/kproxy-dev/kproxy/internal/nl"
)

// FuzzDecode feeds arbitrary netlink payloads to every nf_tables decoder a
// dump uses: whatever the kernel (or a corrupted buffer) sends, decoding
// fails with an error or succeeds, and never panics or reads past its
// input. The seeds are the messages of a batch that holds every kind of
// object the proxiers write, as the kernel would echo them.
func FuzzDecode(f *testing.F) {
	var b Batch
	b.AddTable(Table{Family: Inet, Name: "kproxy"})
	accept := VerdictAccept
	b.AddChain(Chain{Family: Inet, Table: "kproxy", Name: "nat-prerouting", Hook: &Hook{Num: HookPrerouting, Priority: -100, Type: "nat", Policy: &accept}})
	b.AddRule(Rule{Family: Inet, Table: "kproxy", Chain: "services", Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: "s", DestRegister: 0, IsDestRegSet: false},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: "svc"},
	}})
	b.AddSet(Set{Family: Inet, Table: "kproxy", Name: "services4", KeyType: 7, KeyLen: 8, Flags: SetInterval})
	a := netip.MustParseAddr("10.96.0.10").As4()
	b.AddElements(Inet, "kproxy", "services4", []Element{{Key: a[:], KeyEnd: a[:], Data: []byte{1, 2, 3, 4}, Timeout: time.Second, UserData: []byte("x")}, {Key: a[:], Verdict: &Verdict{Code: VerdictJump, Chain: "svc"}}})
	ms, err := nl.Split(b.enc.b[batchReserve:]) // one chunk
	if err != nil {
		f.Fatal(err)
	}
	for _, m := range ms {
		f.Add(m.Data)
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		in := append([]byte(nil), d...)
		_, _ = parseTable(d)
		_, _ = parseChain(d)
		_, _ = parseRule(d)
		_, _ = parseRawRule(d)
		_, _ = parseSet(d)
		_, _ = parseElements(d)
		if string(in) != string(d) {
			t.Fatal("a decoder changed its input")
		}
	})
}
